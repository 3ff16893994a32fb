"""Helpers only the tests use, kept out of the production modules they exercise.

``mini_world``: a small world config (a few seconds to generate); ``stores``: one-call LMDB
writing; ``pretrain``: a plain DataLoader over a pretraining dataset; ``images``: the reject reason
of one image file; ``dbs_synthetic``: a seeded synthetic world in the formats build_dbs reads;
``finetune_world``: that world's real DBs and pretraining exports to fine-tune in; ``canary_world``:
the learning canary's scene world (mini-world scenes and text, stand-in regions); ``extract_world``
and ``scene_kit``: rendered scenes, defective images and mini detector checkpoints for the
extraction and detector tests; ``source_fixtures``: params pointing every source at
tests/fixtures/sources/; ``kill``: a SIGKILL before the k-th filesystem step of an operation.
``tests/`` is on ``sys.path`` under pytest (beside ``tests/conftest.py``), so tests import them as
``helpers.<module>``; a test file itself lives in tests/pipeline/ at the path of the module it
tests (tests/pipeline/extract/test_extract.py for pipeline/extract/extract.py).
"""
