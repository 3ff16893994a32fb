"""Stage ``extract@<image_source>``: Faster R-CNN region features, sharded (docs/design.md §8).

``python -m pipeline extract [ITEM]`` with ITEM an image source (coco, vg, flickr30k, cc, sbu,
vcr, nlvr2), a given-box set (``coco_gt``, ``vcr_gt``), or nothing for every source of
``extract.sources``. Item ``coco`` also writes ``coco_gt`` (RefCOCO+ ground-truth boxes) and
``vcr`` also ``vcr_gt`` (VCR object boxes from the metadata files). ``SOURCE:k/K`` extracts part
k of K of a source, and with ``extract.parts`` > 1 a plain run merges the parts instead of
extracting (:mod:`pipeline.extract.parts`, docs/scaling.md).
The images and outputs of one source are :mod:`pipeline.extract.image_sets`.
"""

from __future__ import annotations

from pipeline.common.ownership import preflight
from pipeline.extract import parts
from pipeline.extract.detector.runner import ExtractorPool
from pipeline.extract.image_sets import extract_set, feature_dir, make_settings, targets
from pipeline.params.parser import Params


def check_item(params: Params, item: str) -> None:
    """Refuse an ITEM that names no image source or part (ParamsError); the CLI calls it before taking the locks."""
    targets(params, parts.split_item(item)[0])


def run(params: Params, item: str | None = None) -> None:
    """Stage entry: extract region features for ``item`` (see module doc) or every source.

    ``SOURCE:k/K`` extracts part k of K; with ``extract.parts`` > 1, a plain run merges the parts
    (:mod:`pipeline.extract.parts`).
    """
    source, part = parts.split_item(item)
    names = targets(params, source)
    if part is not None:
        preflight(*(parts.part_dir(params, name, part) for name in names))
        with ExtractorPool(*make_settings(params)) as pool:
            for name in names:
                parts.extract_part(params, name, part, pool)
        return
    preflight(*(feature_dir(params, name) for name in names))
    if params.extract.parts > 1:
        for name in names:
            parts.merge_parts(params, name, params.extract.parts)
        return
    with ExtractorPool(*make_settings(params)) as pool:  # one pool for the source and its given-box set
        for name in names:
            extract_set(params, name, pool)
