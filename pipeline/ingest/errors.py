"""The download stage's error, in a module of its own: the stage entry (``pipeline.__main__``)
catches it in every stage process, and importing ``download`` (pyarrow, pandas) for that cost each
stage ~0.7 s of its start-up."""

from __future__ import annotations


class DownloadError(RuntimeError):
    """The download cannot start or did not finish; the message says what to do."""
