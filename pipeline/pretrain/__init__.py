"""Stages ``pretrain``, ``pretrain_masking`` and ``pretrain_vcr``: UNITER pretraining.

``pretrain`` is the stages' entry (one rank's run through :mod:`pipeline.training.trainer`),
``plan`` resolves params into what a stage trains on, ``export`` writes ``data/models/<name>/``.
``datasets`` holds the per-task pretraining datasets, ``inputs`` decides which text DBs feed which
task and builds the streams and held-out batches (the model's export format is
:mod:`pipeline.training.model_io`), ``region_init`` fits the region projection to the class names, ``vcr_views`` lays out VCR's
gold-choice sequences (the second stage's and fine-tuning's).
"""
