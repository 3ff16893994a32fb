"""The LMDB image and text stores training reads, and the stages that build them.

``lmdb_store`` is the store format (value codec, atomic batched writer), ``readers`` its lazy readers,
``text_sources`` the text DBs (plain or through a view) a training stage opens,
``vcr_views`` VCR's text DBs read as the gold-choice sequences (second-stage pretraining's and
fine-tuning's layout).
Stage ``build_dbs`` (``build_dbs``) writes them from feature shards (``image_db_builder``) and
manifests (``text_db_builder``, with ``tokenization``, ``vcr_text`` and ``vqa_answers``); stage
``import_uniter_db`` converts UNITER's released LMDBs instead (``uniter_release/``). ``db_cli`` is
``python -m pipeline db``.
"""
