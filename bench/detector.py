"""Benchmark: the mini detector's training iteration, and what a detectron2 config change does to it.

    .venv/bin/python bench/detector.py                 # the preset: 5 rounds of 20 iterations, 2 threads
    .venv/bin/python bench/detector.py --vs MODEL.UNITER.CHANNELS_LAST=False   # the preset vs a change, side by side
    .venv/bin/python bench/detector.py --rounds 1 --iters 2 --images 8     # a smoke run

What ``train_detector`` does per iteration (``pipeline.extract.train_detector.train``: 4 images,
forward with detectron2's losses, backward, clipping, fused AdamW) on the ``mini`` preset at the mini
world's 192-px scale. Each ``--vs KEY=VALUE`` (a detectron2 config key, value read as YAML; several
``KEY=VALUE`` in one ``--vs`` change together) adds an arm built from the preset with that change.

Every arm starts from the same weights (one seeded model, copied) and trains on the same images
and batches (rendered in memory: coloured squares and discs with their boxes, 30 classes), so the
rows differ only in the change. Rounds rotate the order of the arms after one warm-up round each,
so load from elsewhere hits all alike; printed per arm: the median seconds per iteration over
rounds, its ratio to the preset (``vs preset``) and the median of the per-round ratios
(``paired``). The first iteration's losses of every arm are printed too, so a change that should
not move the arithmetic can be seen not to.
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
import bench.common  # noqa: E402,F401  isort: skip  (a stage process's OpenMP wait and malloc, before torch)

NUM_CLASSES = 30
PRESET = "preset"  # the first arm: the mini preset as train_detector builds it


def parse_change(text: str) -> tuple[str, tuple]:
    """``--vs "K1=V1 K2=V2"`` -> (its label, detectron2 overrides (K1, V1, K2, V2)); values read as YAML."""
    import yaml

    overrides = []
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {item!r}")
        overrides += [key, yaml.safe_load(value)]
    if not overrides:
        raise argparse.ArgumentTypeError("expected KEY=VALUE")
    return text, tuple(overrides)


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


def build_arms(size: int, changes: list[tuple[str, tuple]]):
    """{label: model}, the preset first, all from one seeded start; and the preset's detectron2 config."""
    import torch

    from pipeline.extract.detector.build import build_model

    torch.manual_seed(0)
    models, state, preset_cfg = {}, None, None
    for label, overrides in [(PRESET, ())] + changes:
        model, cfg = build_model("mini", num_classes=NUM_CLASSES, image_size=size, overrides=overrides)
        if state is None:  # the preset's seeded start is every arm's
            state, preset_cfg = copy.deepcopy(model.state_dict()), cfg
        model.load_state_dict(state)
        models[label] = model
    return models, preset_cfg


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
    parser.add_argument("--vs", type=parse_change, action="append", default=[], metavar="KEY=VALUE",
                        help="an arm: the preset with this detectron2 config change (repeatable)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)  # as train_detector
    scenes, images = render_scenes(args.images, args.size)
    models, cfg = build_arms(args.size, args.vs)
    arms = list(models)
    width = max(len(a) for a in arms)
    for label, model in models.items():
        print(f"{label:<{width}} first losses {first_losses(model, cfg, scenes, images)}")
    times: dict[str, list[float]] = {label: [] for label in arms}
    for rnd in range(args.rounds + 1):
        order = arms[rnd % len(arms):] + arms[:rnd % len(arms)]
        for label in order:
            seconds = time_round(models[label], cfg, scenes, images, args.iters, seed=rnd)
            if rnd > 0:  # round 0 warms every arm up
                times[label].append(seconds)
        if rnd > 0:
            print(f"round {rnd}: " + ", ".join(f"{a} {times[a][-1] * 1e3:.0f} ms" for a in arms))
    print(f"{'arm':<{width}}  {'s/iter':>7}  {'vs preset':>9}  {'paired':>6}")
    for label in arms:
        med = statistics.median(times[label])
        paired = statistics.median(t / b for t, b in zip(times[label], times[PRESET]))
        print(f"{label:<{width}}  {med:7.3f}  {med / statistics.median(times[PRESET]):9.3f}  {paired:6.3f}")


if __name__ == "__main__":
    main()
