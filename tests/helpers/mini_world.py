"""A small mini world for tests of every stage."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pipeline.params.world import MiniWorldConfig

# The smallest world that still plants every overlap kind and URL variant (tests of every stage).
SMALL_SIZES = dict(n_coco=120, n_vg_only=20, n_flickr30k=50, n_cc=40, n_sbu=30, n_vcr=20, n_nlvr2_pairs=30,
                   n_vqa_test=8, n_refcoco_images=30, n_planted_each=6, vqa_questions_per_image=2,
                   n_vqa_test_extra=0, n_refcoco_test_extra=0, n_vcr_test_extra=0, n_nlvr2_test_extra_pairs=0,
                   n_snli_ve_test_extra=0, n_refcoco_val_extra=0)


def small_config(out_dir: Path | str, **overrides: Any) -> MiniWorldConfig:
    """A MiniWorldConfig of ~350 images (a few seconds to generate) written to ``out_dir``;
    ``overrides`` replace fields (sizes or any other)."""
    return dataclasses.replace(MiniWorldConfig(), out_dir=Path(out_dir), **(SMALL_SIZES | overrides))


def ingest_and_decontaminate(world_dir: Path, root: Path) -> Path:
    """The real chain on a generated world: ``python -m pipeline ingest`` and ``decontaminate`` with
    every ``sources`` path rebased from the default world onto ``world_dir``; returns the data dir."""
    from pipeline.__main__ import main
    from pipeline.ingest import ingest
    from pipeline.params.parser import load_params, to_dict

    params_yaml = Path(__file__).resolve().parents[2] / "params.yaml"
    base = load_params(params_yaml)
    default_root = str(base.mini_world.out_dir)
    overrides = [f"sources.{ds}.{key}={str(value).replace(default_root, str(world_dir), 1)}"
                 for ds, section in to_dict(base.sources).items() for key, value in section.items()
                 if str(value).startswith(default_root)]
    ingest.run(load_params(params_yaml, overrides + [f"paths.data={root / 'data'}"]))
    # decontaminate reads COCO's test image list from sources, so it gets the rebased paths too
    sets = overrides + [f"paths.data={root / 'data'}", "decontaminate.report_samples=4"]
    assert main(["decontaminate", "--params", str(params_yaml), *(a for s in sets for a in ("--set", s))]) == 0
    return root / "data"
