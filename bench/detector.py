"""Benchmark: the mini detector's training iteration, by ROIAlign kernel and memory layout, side by side.

    .venv/bin/python bench/detector.py                 # 4 variants x 5 rounds of 20 iterations, 2 threads
    .venv/bin/python bench/detector.py --rounds 1 --iters 2 --images 8     # a smoke run

What ``train_detector`` does per iteration (``pipeline.extract.train_detector.train``: 4 images,
forward with detectron2's losses, backward, clipping, fused AdamW) on the ``mini`` preset at the mini
world's 192-px scale, for each of:

- ``torchvision / NCHW``:  torchvision's ``roi_align`` (its CPU backward is one serial loop) and
  contiguous weights: the preset before 2026-12-05;
- ``matrix / NCHW``:       ``MODEL.UNITER.ROI_ALIGN: matrix`` (``pipeline.extract.detector.roi_align``);
- ``torchvision / channels-last`` and ``matrix / channels-last`` (``MODEL.UNITER.CHANNELS_LAST``): the
  last is the preset now.

Every variant starts from the same weights (one seeded model, copied) and trains on the same images
and batches (rendered in memory: coloured squares and discs with their boxes, 30 classes), so the
rows differ only in the kernel and the layout. Rounds rotate the order of the variants after one
warm-up round each, so load from elsewhere hits all alike; printed per variant: the median seconds
per iteration over rounds, its ratio to the first row (``vs old``) and the median of the per-round
ratios (``paired``). The first iteration's losses of every variant are printed too: the two ROIAlign
kernels give the same digits; channels-last moves them by ~1e-3 (another convolution algorithm's
rounding can reorder near-tied RPN proposals, and so which ones are sampled).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from pipeline.common.malloc import keep_freed_memory  # noqa: E402  isort: skip
from pipeline.common.openmp import set_stage_wait_policy  # noqa: E402  isort: skip

set_stage_wait_policy()  # as a stage process waits (before torch loads)
keep_freed_memory()

VARIANTS = (("torchvision", False), ("matrix", False), ("torchvision", True), ("matrix", True))
NUM_CLASSES = 30


def layout(variant: tuple[str, bool]) -> str:
    return "channels-last" if variant[1] else "NCHW"


def render_scenes(n: int, size: int, seed: int = 0):
    """``n`` SceneImages over rendered uint8 RGB images (size x size): 2..5 squares / discs each."""
    import numpy as np
    from PIL import Image, ImageDraw

    from pipeline.extract.train_detector import SceneImage

    rng = np.random.default_rng(seed)
    scenes, images = [], []
    for i in range(n):
        img = Image.new("RGB", (size, size), tuple(int(v) for v in rng.integers(60, 200, size=3)))
        draw = ImageDraw.Draw(img)
        boxes, classes = [], []
        for _ in range(int(rng.integers(2, 6))):
            side = int(rng.integers(size // 8, size // 3))
            x, y = int(rng.integers(0, size - side)), int(rng.integers(0, size - side))
            cls = int(rng.integers(0, NUM_CLASSES))
            fill = tuple(int(v) for v in rng.integers(0, 255, size=3))
            (draw.ellipse if cls % 2 else draw.rectangle)([x, y, x + side, y + side], fill=fill)
            boxes.append([x, y, x + side, y + side])
            classes.append(cls)
        scenes.append(SceneImage(key=f"bench/{i}", path=Path(f"bench/{i}.png"),
                                 boxes=np.array(boxes, dtype=np.float32), classes=np.array(classes, dtype=np.int64),
                                 shapes=["disc" if c % 2 else "square" for c in classes]))
        images.append(np.asarray(img))
    return scenes, images


def build_variants(size: int):
    """{(roi_align, channels_last): model} from one seeded start, and the detectron2 config."""
    import torch

    from pipeline.extract.detector.build import build_model

    torch.manual_seed(0)
    models, state = {}, None
    for impl, channels_last in VARIANTS:
        overrides = ("MODEL.UNITER.ROI_ALIGN", impl, "MODEL.UNITER.CHANNELS_LAST", channels_last)
        model, cfg = build_model("mini", num_classes=NUM_CLASSES, image_size=size, overrides=overrides)
        if state is None:  # the first variant's seeded start is every variant's
            state = copy.deepcopy(model.state_dict())
        model.load_state_dict(state)
        models[(impl, channels_last)] = model
    return models, cfg


def first_losses(model, cfg, scenes, images) -> dict[str, float]:
    """The losses of one training forward on the first batch (no update), from the seeded RNG state."""
    import math

    import torch
    from detectron2.utils.events import EventStorage

    from pipeline.extract.train_detector import _training_input

    torch.manual_seed(1)
    model.train()
    scale = cfg.INPUT.MIN_SIZE_TRAIN[0] / min(images[0].shape[:2])
    batch = [_training_input(images[i], scenes[i], scale, False) for i in range(4)]
    with EventStorage(0):  # with gradients: the training path of the ROIAlign (no backward is run)
        losses = model(batch)
    values = {k: float(v.detach()) for k, v in losses.items()}
    return {k: round(v, 5) for k, v in values.items() if math.isfinite(v)}


def time_round(model, cfg, scenes, images, iters: int, seed: int) -> float:
    """Seconds per iteration of ``iters`` train_detector iterations on a copy of ``model``."""
    import torch

    from pipeline.extract.train_detector import train

    torch.manual_seed(seed)
    trained = copy.deepcopy(model)
    start = time.perf_counter()
    train(trained, cfg, scenes, images, max_iters=iters, ims_per_batch=4, lr=0.002, deadline=None, seed=seed)
    return (time.perf_counter() - start) / iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=20, help="iterations per round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds after the warm-up round")
    parser.add_argument("--images", type=int, default=64, help="rendered training images")
    parser.add_argument("--size", type=int, default=192, help="image side (the mini world's 192)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (train_detector uses every core)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)  # as train_detector
    scenes, images = render_scenes(args.images, args.size)
    models, cfg = build_variants(args.size)
    for key, model in models.items():
        print(f"{key[0]:>11} / {layout(key):13s} first losses {first_losses(model, cfg, scenes, images)}")
    times: dict[tuple, list[float]] = {key: [] for key in VARIANTS}
    for rnd in range(args.rounds + 1):
        order = VARIANTS[rnd % len(VARIANTS):] + VARIANTS[:rnd % len(VARIANTS)]
        for key in order:
            seconds = time_round(models[key], cfg, scenes, images, args.iters, seed=rnd)
            if rnd > 0:  # round 0 warms every variant up
                times[key].append(seconds)
        if rnd > 0:
            print(f"round {rnd}: " + ", ".join(f"{k[0]}/{layout(k)} {times[k][-1] * 1e3:.0f} ms" for k in VARIANTS))
    base = VARIANTS[0]
    print(f"{'ROIAlign':>11}   {'layout':13s}  {'s/iter':>7}  {'vs old':>6}  {'paired':>6}")
    for key in VARIANTS:
        med = statistics.median(times[key])
        paired = statistics.median(t / b for t, b in zip(times[key], times[base]))
        print(f"{key[0]:>11}   {layout(key):13s}  {med:7.3f}  "
              f"{med / statistics.median(times[base]):6.3f}  {paired:6.3f}")


if __name__ == "__main__":
    main()
