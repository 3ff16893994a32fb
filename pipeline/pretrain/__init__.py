"""Stages ``pretrain``, ``pretrain_masking`` and ``pretrain_vcr``: UNITER pretraining.

``pretrain`` is the stages' entry (one rank's run through :mod:`pipeline.training.trainer`),
``plan`` resolves params into what a stage trains on, ``export`` writes ``data/models/<name>/``.
``datasets`` holds the per-task pretraining datasets, ``inputs`` decides which text DBs feed which
task and builds the streams and held-out batches (the model's export format and the region
projection's class-name start are :mod:`pipeline.training.model_io` and
:mod:`pipeline.training.region_init`), ``vcr_views`` lays out VCR's
gold-choice sequences (the second stage's and fine-tuning's).
"""
