"""Helpers only the tests use, kept out of the production modules they exercise.

``mini_world``: a small world config (a few seconds to generate); ``stores``: one-call LMDB
writing; ``pretrain``: a plain DataLoader over a pretraining dataset; ``images``: the reject reason
of one image file. ``tests/`` is on ``sys.path`` under pytest (beside ``tests/conftest.py``), so
tests import them as ``helpers.<module>``.
"""
