"""The mini world: a deterministic generator of every raw dataset in its real published format.

``run(params)`` renders scenes of coloured shapes and writes COCO, VG, Flickr30k, CC, SBU, VQA,
VCR, NLVR2, SNLI-VE and RefCOCO+ files below ``params.mini_world.out_dir`` (docs/design.md §3),
plus ``planted.json`` (the overlaps and defects it planted, §2) and ``scenes.json`` (every image's
scene graph). Same params and seed => byte-identical tree.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Mapping

from pipeline.common.progress import track
from pipeline.common.ownership import atomic_dir
from pipeline.common.runinfo import RunRecord, tree_digest
from pipeline.mini_world.coco import write_coco
from pipeline.mini_world.flickr30k import write_flickr30k, write_snli_ve
from pipeline.mini_world.nlvr2 import write_nlvr2
from pipeline.mini_world.refcoco import write_refcoco
from pipeline.mini_world.eval_extension import write_eval_extension
from pipeline.mini_world.vcr import write_vcr
from pipeline.mini_world.vg import write_vg
from pipeline.mini_world.vqa import write_vqa
from pipeline.mini_world.web import write_cc, write_sbu
from pipeline.mini_world.world import World
from pipeline.params.decontaminate import DEFAULT_EVAL_SPLITS, effective_eval_splits
from pipeline.params.finetune import TASKS
from pipeline.params.world import MiniWorldConfig

# order matters: later writers plant copies of (and look up) what earlier ones wrote
WRITERS: tuple[tuple[str, Callable[[World], None]], ...] = (
    ("flickr30k", write_flickr30k),
    ("snli_ve", write_snli_ve),
    ("coco", write_coco),
    ("refcoco", write_refcoco),
    ("vqa", write_vqa),
    ("nlvr2", write_nlvr2),
    ("vcr", write_vcr),
    ("vg", write_vg),
    ("cc", write_cc),
    ("sbu", write_sbu),
    ("eval_extension", write_eval_extension),  # last: the extra eval items move nothing written before
)


def generate(cfg: MiniWorldConfig, seed: int, out_dir: Path | str | None = None,
             eval_splits: Mapping[str, tuple[str, ...]] | None = None, *, progress: bool = True) -> World:
    """Write a whole world into ``out_dir`` (default ``cfg.out_dir``, replaced atomically); return it.

    ``eval_splits`` ({dataset: splits}) decides which uses of an image make it an eval image in
    planted.json's ``matches``; default: what the default params remove (the decontaminate section's
    defaults and every split of every fine-tuning task).
    """
    out_dir = Path(cfg.out_dir if out_dir is None else out_dir)
    if eval_splits is None:
        eval_splits = effective_eval_splits(DEFAULT_EVAL_SPLITS, TASKS)
    with atomic_dir(out_dir, stage="mini_world") as tmp:
        world = World(cfg, seed, tmp, eval_splits)
        bar = track(WRITERS, desc="mini_world", unit="dataset", disable=not progress)
        for name, writer in bar:
            bar.set_postfix_str(name)
            writer(world)
        _register_eval_split_rows(world)
        world.write_json("planted.json", world.planted(), indent=1)  # read by people too
        world.write_json("scenes.json", world.scenes())
    world.root = Path(out_dir)
    return world


def _register_eval_split_rows(world: World) -> None:
    """COCO caption images that are themselves eval images (Karpathy test, RefCOCO+ val/test):
    listed so that planted.json names every pretraining image decontamination must remove."""
    planted = {(o["dataset"], o["image_id"]) for o in world.overlaps}
    coco = world.info["coco"]
    for key in coco["keys"]:
        if key in world.broken or ("coco", key.split("/")[1]) in planted or not world.is_eval(key):
            continue
        kinds = sorted({m.split("/")[0] for m in world.eval_matches(key)})
        world.overlap("coco", key.split("/")[1], coco["coco_url"][key], "eval_split", [key],
                      "eval image itself: " + "+".join(kinds))


def run(params) -> dict[str, Any]:
    """The ``mini_world`` stage: generate ``params.mini_world`` with ``params.seed``; write ``_run.json``."""
    cfg = params.mini_world
    out_dir = Path(cfg.out_dir)
    record = RunRecord("mini_world", params.section_digest("seed", "mini_world"))
    start = time.time()
    # planted.json's eval matches use the default eval splits (recorded in the file), not
    # params.decontaminate: an eval-split ablation must not regenerate the raw data and everything after it
    world = generate(cfg, params.seed, out_dir)
    record.counts = dict(sorted(world.counts.items())) | {
        "images": len(world.images), "overlaps": len(world.overlaps), "defects": len(world.defects)}
    record.extra["tree_digest"] = tree_digest(out_dir)
    record.write(out_dir)
    print(f"mini_world: {len(world.images)} images, {len(world.overlaps)} planted overlaps, "
          f"{len(world.controls)} controls, {len(world.defects)} defects -> {out_dir} in {time.time() - start:.1f}s")
    return record.counts
