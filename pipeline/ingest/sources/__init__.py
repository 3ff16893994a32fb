"""One reader per real source format; each module exposes the same small interface.

``DATASET``, ``IMAGE_SOURCE`` (or a per-row image source), ``COLUMNS`` (the dataset's own
manifest columns as pyarrow fields, after the core ones), ``IMAGES_REPEAT`` (whether many rows
share one image, so image checks are worth caching), ``input_files(sources) -> {name: path}``
(annotation files, for ``_run.json`` digests) and ``read(ctx) -> Iterator[Row | Reject]`` (exactly
one item per raw row).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from pipeline.params.ingest import DATASETS
from pipeline.params.parser import ParamsError  # an unknown ITEM is a bad argument: exit status 2


def load_reader(dataset: str) -> ModuleType:
    """The reader module of ``dataset`` (one of :data:`pipeline.params.ingest.DATASETS`)."""
    if dataset not in DATASETS:
        raise ParamsError(f"unknown dataset {dataset!r}; expected one of {', '.join(DATASETS)}")
    return importlib.import_module(f"pipeline.ingest.sources.{dataset}")
