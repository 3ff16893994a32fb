"""The training machinery both training stages run on: pretraining (pipeline/pretrain/) and
fine-tuning (pipeline/finetune/).

``trainer`` is the harness a stage calls (settings in, engine, fit, consolidated weights out); it
ties together one concern per module: ``engine`` (DeepSpeed config + initialize), ``task_mix``
(the seeded task schedule), ``streams`` (resumable per-task batch streams), ``batching`` (the
token-bucket sampler and the collate that packs text and regions), ``checkpointing`` (save / exact
resume / consolidated export), ``launch`` (the ``deepspeed`` launcher and process groups),
``metrics`` (dvclive logging, running means, validation), ``loop`` (the step loop).
The harness knows nothing about UNITER's tasks: it trains any module whose ``forward(batch, task)``
returns an object with ``loss`` and ``metrics``. What both stages share about the model itself sits
beside it: ``model_io`` (build the model from params; write and read back its exported form) and
``region_init`` (the region projection's start fitted to the detector's class names); ``paired``
says how far a fine-tuning gain can be trusted (its paired interval, the spread over seeds).
"""
