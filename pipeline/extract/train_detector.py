"""Stage ``train_detector``: fit the narrow C4 detector (preset ``mini``) to the mini world's boxes.

Reads ``<mini_world.out_dir>/scenes.json`` (docs/design.md §4: every rendered image with its
objects' boxes and categories). Trains on the COCO train2014 images, except ``holdout_images`` of
them (a seeded draw) kept for evaluation and the images of RefCOCO+'s val and test splits
(``sources.refcoco.refs``): RefCOCO+ is scored on the detector's boxes, and the referring-expression
convention (MAttNet's detector, which UNITER's RefCOCO+ numbers use) trains the detector on COCO's
train images without those. The recipe (docs/design.md §8): from scratch, AdamW, linear
warm-up then cosine decay, horizontal flips (every shape of the mini world is left-right
symmetric). The schedule runs over ``max_iters`` iterations; with ``max_minutes > 0`` it also
runs against the clock (progress = the larger of the two fractions) and stops when time is up, so
the stage fits its budget on a busy machine; ``max_minutes: 0`` makes it iteration-only and
deterministic.

Writes ``data/models/detector/``: ``model_final.pth`` ({"model": state_dict, "meta": class names,
image size, ...}), ``config.yaml`` (the detectron2 config), ``metrics.json`` (held-out quality)
and ``_run.json``. Quality on the held-out images, with the extraction stage's own keep rule
(conf >= conf_th, 10..100 boxes): ``recall`` = planted objects covered by a kept box at IoU >= 0.5;
``shape_acc`` = planted objects whose best-overlapping kept box (IoU >= 0.5) has a top soft label
of the right shape; ``class_acc`` the same for shape and colour.
"""

from __future__ import annotations

import io
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.common.ownership import atomic_dir, preflight
from pipeline.common.runinfo import RunRecord, atomic_write_json
from pipeline.common.detector_files import METRICS_FILE, WEIGHTS_FILE, detector_dir
from pipeline.extract.detector.build import Detector, build_model
from pipeline.extract.detector.extractor import RegionExtractor, Regions
from pipeline.common.image_io import ImageRejected, decode_image
from pipeline.params.parser import Params, to_dict

log = logging.getLogger("pipeline.train_detector")
WARMUP_ITERS = 100
EVAL_RESERVE_S = 20.0  # of the time budget, kept for evaluation and saving
# held-out quality the recipe must reach (metrics.json "targets"; the results stage reports against them)
TARGETS = {"recall": 0.9, "shape_acc": 0.8}


@dataclass
class SceneImage:
    """A rendered image with its planted objects: ``boxes`` [k, 4] x1, y1, x2, y2 pixels,
    ``classes`` [k] 0-based class indices, ``shapes`` the k shape names."""

    key: str
    path: Path
    boxes: np.ndarray
    classes: np.ndarray
    shapes: list[str]


def class_table(scenes: dict) -> list[tuple[int, str, str]]:
    """(category_id, "colour shape", shape) of every category seen in ``scenes``, by category id."""
    found: dict[int, tuple[str, str]] = {}
    for key, scene in scenes.items():
        for obj in scene["objects"]:
            name = f"{obj['colour']} {obj['shape']}"
            if found.setdefault(int(obj["category_id"]), (name, obj["shape"])) != (name, obj["shape"]):
                raise ValueError(f"scenes.json: category {obj['category_id']} means two things ({key})")
    return [(cid, *found[cid]) for cid in sorted(found)]


def refcoco_eval_images(refs_path: Path) -> set[str]:
    """``coco/<image_id>`` of every image a RefCOCO+ val / test ref is about (``refs(unc).p``)."""
    from pipeline.common.plain_pickle import load_plain_pickle

    refs = load_plain_pickle(refs_path)
    return {f"coco/{r['image_id']}" for r in refs
            if isinstance(r, dict) and r.get("split") not in (None, "train") and "image_id" in r}


def load_scenes(world: Path, *, holdout: int, seed: int,
                exclude: frozenset[str] = frozenset()) -> tuple[list[SceneImage], list[SceneImage], list]:
    """Train / held-out COCO train2014 images of the mini world (none of ``exclude``, image keys
    ``coco/<id>``), and the class table."""
    path = world / "scenes.json"
    scenes = json.loads(path.read_text(encoding="utf-8"))
    table = class_table(scenes)
    index = {cid: i for i, (cid, _, _) in enumerate(table)}
    keys = sorted(k for k, s in scenes.items()
                  if k.startswith("coco/") and "/train2014/" in f"/{s['path']}" and k not in exclude)
    if len(keys) <= holdout:
        raise ValueError(f"{path}: {len(keys)} COCO train2014 images, need more than holdout_images={holdout}")
    images = []
    for key in keys:
        objs = scenes[key]["objects"]
        images.append(SceneImage(
            key=key, path=world / scenes[key]["path"],
            boxes=np.array([o["box"] for o in objs], dtype=np.float32).reshape(-1, 4),
            classes=np.array([index[int(o["category_id"])] for o in objs], dtype=np.int64),
            shapes=[o["shape"] for o in objs]))
    order = np.random.default_rng(seed).permutation(len(images))
    held = sorted(order[:holdout].tolist())
    train = [images[i] for i in sorted(order[holdout:].tolist())]
    return train, [images[i] for i in held], table


def _training_input(rgb: np.ndarray, scene: SceneImage, scale: float, flip: bool) -> dict:
    """One detectron2 training input: BGR float image [3, h, w] (0..255) + Instances."""
    from detectron2.structures import Boxes, Instances

    x = torch.from_numpy(np.ascontiguousarray(rgb[:, :, ::-1].transpose(2, 0, 1))).float()
    boxes = torch.from_numpy(scene.boxes.copy())
    if scale != 1.0:
        size = (round(rgb.shape[0] * scale), round(rgb.shape[1] * scale))
        x = torch.nn.functional.interpolate(x[None], size=size, mode="bilinear", align_corners=False)[0]
        boxes = boxes * scale
    if flip:
        x = x.flip(-1)
        width = x.shape[-1]
        boxes = torch.stack([width - boxes[:, 2], boxes[:, 1], width - boxes[:, 0], boxes[:, 3]], dim=1)
    inst = Instances(tuple(x.shape[-2:]))
    inst.gt_boxes = Boxes(boxes)
    inst.gt_classes = torch.from_numpy(scene.classes.copy())
    return {"image": x, "instances": inst}


def train(model: torch.nn.Module, cfg, scenes: list[SceneImage], images: list[np.ndarray], *, max_iters: int,
          ims_per_batch: int, lr: float, deadline: float | None, seed: int) -> dict:
    """Fit ``model`` in place; return training stats (iterations, time, last losses, stop reason)."""
    from detectron2.utils.events import EventStorage
    from pipeline.common.progress import track

    rng = np.random.default_rng(seed)
    min_size = cfg.INPUT.MIN_SIZE_TRAIN[0]
    scales = [min_size / min(img.shape[:2]) for img in images]
    params = [p for p in model.parameters() if p.requires_grad]
    # fused: one kernel over the 169 tensors; torch's CPU default loops over them in Python (7% of an iteration)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=1e-4, fused=True)
    model.train()
    start = time.time()
    budget = None if deadline is None else max(1.0, deadline - start)
    stopped_by, it, recent = "max_iters", 0, []
    bar = track(total=max_iters, desc="train_detector", unit="it")
    storage = EventStorage(0).__enter__()  # detectron2's heads log training statistics into it
    for it in range(max_iters):
        storage.iter = it
        elapsed = time.time() - start
        if budget is not None and elapsed >= budget:
            stopped_by = "time"
            break
        progress = max(it / max_iters, elapsed / budget if budget else 0.0)
        warm = min(1.0, (it + 1) / WARMUP_ITERS)
        for group in optimizer.param_groups:
            group["lr"] = lr * warm * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
        picks = rng.choice(len(scenes), size=min(ims_per_batch, len(scenes)), replace=False)
        flips = rng.random(len(picks)) < 0.5
        batch = [_training_input(images[i], scenes[i], scales[i], bool(f)) for i, f in zip(picks, flips)]
        losses = model(batch)
        loss = sum(losses.values())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        optimizer.step()
        recent = (recent + [{k: float(v.detach()) for k, v in losses.items()}])[-50:]
        bar.update(1)
        if it % 20 == 0:
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}")
    else:
        it = max_iters
    storage.__exit__(None, None, None)
    bar.close()
    model.eval()
    seconds = time.time() - start
    mean_losses = {k: round(float(np.mean([r[k] for r in recent])), 4) for k in (recent[0] if recent else {})}
    return {"iterations": it, "train_seconds": round(seconds, 1), "seconds_per_iter": round(seconds / max(it, 1), 3),
            "stopped_by": stopped_by, "final_losses": mean_losses}


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix [len(a), len(b)] of x1, y1, x2, y2 boxes."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(axis=2)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    return inter / np.maximum(area(a)[:, None] + area(b)[None, :] - inter, 1e-9)


def score_regions(scenes: list[SceneImage], regions: list[Regions], shapes: list[str]) -> dict:
    """Recall / shape / class accuracy of kept ``regions`` against the planted objects of ``scenes``.

    A planted object is covered when some kept box has IoU >= 0.5 with it; its prediction is the
    top soft label (argmax over background + classes) of the kept box that overlaps it most.
    ``shapes[c]`` is the shape of foreground class c.
    """
    objects = covered = shape_ok = class_ok = 0
    for scene, reg in zip(scenes, regions):
        objects += len(scene.boxes)
        if len(scene.boxes) == 0 or len(reg.boxes) == 0:
            continue
        iou = box_iou(scene.boxes, reg.boxes)
        top = reg.soft_labels.argmax(axis=1)  # 0 = background
        for k in range(len(scene.boxes)):
            j = int(iou[k].argmax())
            if iou[k, j] < 0.5:
                continue
            covered += 1
            label = int(top[j]) - 1
            shape_ok += label >= 0 and shapes[label] == scene.shapes[k]
            class_ok += label == int(scene.classes[k])
    frac = lambda n: round(n / objects, 4) if objects else 0.0  # noqa: E731
    return {"images": len(scenes), "objects": objects, "recall": frac(covered), "shape_acc": frac(shape_ok),
            "class_acc": frac(class_ok),
            "regions_per_image": round(float(np.mean([len(r.boxes) for r in regions])), 2) if regions else 0.0}


def evaluate(detector: Detector, scenes: list[SceneImage], images: list[np.ndarray], *, shapes: list[str],
             conf_th: float, min_boxes: int, max_boxes: int, batch_size: int = 8) -> dict:
    """Held-out quality of ``detector`` with the extraction keep rule: see :func:`score_regions`."""
    extractor = RegionExtractor(detector, conf_th=conf_th, min_boxes=min_boxes, max_boxes=max_boxes,
                                batch_size=batch_size)
    return score_regions(scenes, extractor.extract(images), shapes)


def _decode_all(scenes: list[SceneImage]) -> list[np.ndarray]:
    out = []
    for scene in scenes:
        try:
            out.append(decode_image(scene.path))
        except ImageRejected as rej:
            raise ValueError(f"scenes.json lists {scene.key}, but its image is unusable: {rej.detail}") from None
    return out


def run(params: Params) -> dict:
    """Stage entry: train, evaluate on the held-out images, save to ``data/models/detector/``."""
    start = time.time()
    cfg = params.extract.train
    world = Path(params.mini_world.out_dir)
    preflight(detector_dir(params.paths.data))  # refuse a foreign folder before training
    torch.manual_seed(params.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # NaN-filling every new tensor costs ~10%
    excluded = frozenset(refcoco_eval_images(Path(params.sources.refcoco.refs)))
    train_set, held_set, table = load_scenes(world, holdout=cfg.holdout_images, seed=params.seed, exclude=excluded)
    train_images, held_images = _decode_all(train_set), _decode_all(held_set)
    class_names, shapes = [name for _, name, _ in table], [shape for _, _, shape in table]
    model, d2cfg = build_model("mini", num_classes=len(table), image_size=params.mini_world.image_size)
    deadline = start + cfg.max_minutes * 60.0 - EVAL_RESERVE_S if cfg.max_minutes > 0 else None
    log.info("train_detector: %d train / %d held-out images (%d RefCOCO+ val/test images left out), %d classes, "
             "up to %d iterations%s", len(train_set), len(held_set), len(excluded), len(table), cfg.max_iters,
             f" or {cfg.max_minutes:g} min" if deadline else "")
    stats = train(model, d2cfg, train_set, train_images, max_iters=cfg.max_iters, ims_per_batch=cfg.ims_per_batch,
                  lr=cfg.lr, deadline=deadline, seed=params.seed)
    meta = {"preset": "mini", "class_names": class_names, "category_ids": [cid for cid, _, _ in table],
            "shapes": shapes, "image_size": params.mini_world.image_size}
    detector = Detector(model=model, cfg=d2cfg, preset="mini", class_names=class_names, attribute_names=[],
                        weights=None)
    ex = params.extract
    quality = evaluate(detector, held_set, held_images, shapes=shapes, conf_th=ex.conf_th, min_boxes=ex.min_boxes,
                       max_boxes=ex.max_boxes, batch_size=ex.batch_size)
    # metrics.json is a stage output, so it holds no wall-clock numbers (two runs must give the
    # same bytes); the timings go to _run.json
    wall_clock = ("train_seconds", "seconds_per_iter")
    training = {k: v for k, v in stats.items() if k not in wall_clock}
    metrics = {"quality": quality, "training": training, "targets": dict(TARGETS),
               "targets_met": all(quality[k] >= v for k, v in TARGETS.items())}

    out = detector_dir(params.paths.data)
    record = RunRecord("train_detector", params.section_digest("seed", "mini_world", "extract"))
    record.inputs["scenes"] = world / "scenes.json"
    record.inputs["refcoco_refs"] = Path(params.sources.refcoco.refs)
    record.counts.update({"train_images": len(train_set), "holdout_images": len(held_set),
                          "excluded_refcoco_eval_images": len(excluded),
                          "holdout_objects": quality["objects"], "iterations": stats["iterations"]})
    record.extra.update({"quality": quality, "training": stats, "targets_met": metrics["targets_met"],
                         "threads": torch.get_num_threads(), "train_params": to_dict(cfg)})
    with atomic_dir(out, stage="train_detector") as tmp:
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "meta": meta}, buf)
        (tmp / WEIGHTS_FILE).write_bytes(buf.getvalue())
        (tmp / "config.yaml").write_text(d2cfg.dump())
        atomic_write_json(tmp / METRICS_FILE, metrics)
        record.write(tmp)
    verdict = ("targets met" if metrics["targets_met"] else
               f"BELOW TARGET (recall {TARGETS['recall']}, shape {TARGETS['shape_acc']})")
    print(f"train_detector: {stats['iterations']} iterations in {stats['train_seconds']:.0f}s "
          f"({stats['seconds_per_iter']:.3f} s/iter, stopped by {stats['stopped_by']}); held-out "
          f"{quality['images']} images / {quality['objects']} objects: recall@0.5 {quality['recall']:.3f}, "
          f"shape {quality['shape_acc']:.3f}, class {quality['class_acc']:.3f} "
          f"({verdict})")
    return metrics
