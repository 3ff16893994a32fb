"""Stages ``pretrain``, ``pretrain_masking`` and ``pretrain_vcr``: UNITER pretraining.

``pretrain`` is the stages' entry (one rank's run through :mod:`pipeline.training.trainer`),
``plan`` resolves params into what a stage trains on, ``export`` writes ``data/models/<name>/``.
``datasets`` holds the per-task pretraining datasets, ``inputs`` decides which text DBs feed which
task and builds the streams and held-out batches. Shared with fine-tuning, and so outside this
package: the model's export format (:mod:`pipeline.training.model_io`), the region projection's
class-name start (:mod:`pipeline.training.region_init`) and VCR's gold-choice views
(:mod:`pipeline.stores.vcr_views`).
"""
