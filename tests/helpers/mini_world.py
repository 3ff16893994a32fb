"""A small mini world for tests of every stage."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pipeline.params.world import MiniWorldConfig

# The smallest world that still plants every overlap kind and URL variant (tests of every stage).
SMALL_SIZES = dict(n_coco=120, n_vg_only=20, n_flickr30k=50, n_cc=40, n_sbu=30, n_vcr=20, n_nlvr2_pairs=30,
                   n_vqa_test=8, n_refcoco_images=30, n_planted_each=6, vqa_questions_per_image=2)


def small_config(out_dir: Path | str, **overrides: Any) -> MiniWorldConfig:
    """A MiniWorldConfig of ~350 images (a few seconds to generate) written to ``out_dir``;
    ``overrides`` replace fields (sizes or any other)."""
    return dataclasses.replace(MiniWorldConfig(), out_dir=Path(out_dir), **(SMALL_SIZES | overrides))
