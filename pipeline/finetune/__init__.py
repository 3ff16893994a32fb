"""Stage ``finetune@<task>``: fine-tune the pretrained model on each downstream task and evaluate it.

``finetune`` is the stage (tasks, starts, outputs); ``runner`` trains and evaluates one start of one
task through :mod:`pipeline.training.trainer`; ``tasks/`` holds one module per task (dataset,
collate, training step, evaluation, metrics).
"""
