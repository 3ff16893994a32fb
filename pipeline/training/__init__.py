"""Training machinery for the pretraining stages (pipeline/pretrain.py).

One concern per module: ``engine`` (DeepSpeed config + initialize), ``task_mix`` (the seeded task
schedule), ``streams`` (resumable per-task batch streams), ``checkpointing`` (save / exact resume /
consolidated export), ``launch`` (the ``deepspeed`` launcher and process groups), ``metrics``
(dvclive logging, running means, validation), ``loop`` (the step loop tying them together).
Nothing here knows about UNITER: it trains any module whose ``forward(batch, task)`` returns an
object with ``loss`` and ``metrics``.
"""
