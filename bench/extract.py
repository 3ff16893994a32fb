"""Benchmark: region extraction throughput and peak memory, batched vs unbatched, side by side.

    .venv/bin/python bench/extract.py                 # CPU: mini detector, 192 px and 600x1000 images
    .venv/bin/python bench/extract.py --r101          # + the R101-C4 model at 600/1000 on CPU (slow)
    .venv/bin/python bench/extract.py --device cuda   # R101-C4 at 600/1000 on a GPU (< 2 min)

Images are rendered in memory (coloured shapes on a smooth background), so the numbers are the
detector's: resize, backbone, RPN, res5 head, the max-confidence selection and the copy back to
numpy. Decoding is measured apart (JPEG of the same size, one thread) for reference.

Weights: the trained mini detector (``data/models/detector/model_final.pth``) when present,
otherwise a random one; R101-C4 always random (the real weights are not here), with its norms
calibrated and its classifier sharpened so that proposals and per-class NMS do realistic work.
Timing cost does not depend on the weights' values otherwise.

CPU runs use one torch thread, as each extraction worker does (``--threads`` to change it).
Each CPU configuration runs in its own subprocess, so its peak RSS (ru_maxrss) is its own; on
CUDA the peak is ``torch.cuda.max_memory_allocated``. Printed: images/s, peak memory, and the
batched / unbatched throughput ratio per image size.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from pipeline.common.malloc import keep_freed_memory  # noqa: E402  isort: skip
from pipeline.common.openmp import set_stage_wait_policy  # noqa: E402  isort: skip

set_stage_wait_policy()  # as a stage process waits (before torch loads)
keep_freed_memory()  # and keeps freed memory


def render_images(n: int, height: int, width: int, seed: int = 0):
    """``n`` uint8 RGB images: smooth background + 3..6 filled shapes."""
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        coarse = rng.integers(60, 200, size=(4, 4, 3), dtype=np.uint8)
        img = Image.fromarray(coarse, "RGB").resize((width, height), Image.BICUBIC)
        draw = ImageDraw.Draw(img)
        for _ in range(int(rng.integers(3, 7))):
            side = int(rng.integers(min(height, width) // 8, min(height, width) // 3))
            x, y = int(rng.integers(0, width - side)), int(rng.integers(0, height - side))
            fill = tuple(int(v) for v in rng.integers(0, 255, size=3))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x, y, x + side, y + side], fill=fill)
        out.append(np.asarray(img))
    return out


def make_detector(preset: str, device: str, size: int):
    """The detector to time (see module doc) on ``device``."""
    import torch

    from pipeline.extract.detector.build import Detector, build_model, calibrate_norms, load_detector
    from pipeline.extract.detector.extractor import RegionExtractor

    trained = REPO / "data" / "models" / "detector" / "model_final.pth"
    if preset == "mini" and trained.is_file():
        return load_detector("mini", trained, device=device), "trained"
    torch.manual_seed(0)
    model, cfg = build_model(preset, num_classes=30 if preset == "mini" else None, image_size=size, device=device)
    names = [f"c{i}" for i in range(cfg.MODEL.ROI_HEADS.NUM_CLASSES)]
    detector = Detector(model=model, cfg=cfg, preset=preset, class_names=names, attribute_names=[], weights=None)
    probe = render_images(1, 600, 1000, seed=99)[0]
    x = RegionExtractor(detector).to_input(probe)[0][None]
    calibrate_norms(model, x)
    with torch.no_grad():  # sharpen the random classifier: logits with std ~4, like a trained one
        feats = model.backbone(x)
        from detectron2.structures import Boxes

        h, w = x.shape[-2:]
        crops = Boxes(torch.tensor([[0, 0, w / 2, h / 2], [w / 4, h / 4, w, h]], device=x.device))
        logits = model.roi_heads.predict(model.roi_heads.pooled_features(feats, [crops]))["class_logits"]
        scale = 4.0 / float(logits.std().clamp_min(1e-6))
        predictor = model.roi_heads.box_predictor
        predictor.cls_score.weight.mul_(scale)
        predictor.cls_score.bias.mul_(scale)
    return detector, "random (calibrated)"


def time_config(preset: str, device: str, height: int, width: int, n: int, batch: int, amp: str | None,
                threads: int = 1) -> dict:
    """images/s of one configuration after one warm-up batch, and its peak memory (MB)."""
    import torch

    from pipeline.extract.detector.extractor import RegionExtractor, autocast_dtype

    if device == "cpu":
        torch.set_num_threads(threads)
    detector, weights = make_detector(preset, device, min(height, width))
    extractor = RegionExtractor(detector, batch_size=batch, amp=autocast_dtype(amp))
    images = render_images(n + batch, height, width)
    extractor.extract(images[:batch])  # warm-up (allocator, kernels)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    regions = extractor.extract(images[batch:])
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated() / 2**20 if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return {"preset": preset, "weights": weights, "device": device, "size": f"{height}x{width}", "images": n,
            "batch": batch, "amp": amp or "fp32", "images_per_s": n / seconds, "peak_mb": peak,
            "regions_per_image": sum(len(r.boxes) for r in regions) / n}


def decode_rate(height: int, width: int, n: int = 20) -> float:
    """JPEG decode images/s (pipeline.common.image_io, one thread) at this size."""
    import tempfile

    from PIL import Image

    from pipeline.common.image_io import decode_image

    images = render_images(n, height, width, seed=5)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, img in enumerate(images):
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, format="JPEG", quality=90)
            paths.append(Path(tmp) / f"{i}.jpg")
            paths[-1].write_bytes(buf.getvalue())
        start = time.perf_counter()
        for p in paths:
            decode_image(p)
        return n / (time.perf_counter() - start)


def in_subprocess(config: dict) -> dict:
    """Run one CPU configuration in a fresh interpreter (its own peak RSS)."""
    out = subprocess.run([sys.executable, __file__, "--one", json.dumps(config)], capture_output=True, text=True,
                         cwd=REPO, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"bench configuration {config} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(rows: list[dict]) -> None:
    print(f"{'model':<10} {'weights':<20} {'device':<6} {'image':<9} {'batch':>5} {'amp':<5} {'img/s':>8} "
          f"{'peak MB':>8} {'regions':>7}")
    for r in rows:
        print(f"{r['preset']:<10} {r['weights']:<20} {r['device']:<6} {r['size']:<9} {r['batch']:>5} {r['amp']:<5} "
              f"{r['images_per_s']:>8.2f} {r['peak_mb']:>8.0f} {r['regions_per_image']:>7.1f}")
    groups: dict[tuple, dict] = {}
    for r in rows:
        groups.setdefault((r["preset"], r["size"], r["amp"]), {})[r["batch"]] = r["images_per_s"]
    for (preset, size, amp), by_batch in groups.items():
        if 1 in by_batch and len(by_batch) > 1:
            big = max(by_batch)
            print(f"batched/unbatched {preset} {size} {amp}: batch {big} is {by_batch[big] / by_batch[1]:.2f}x batch 1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--r101", action="store_true", help="CPU: also time R101-C4 at 600/1000 (minutes)")
    parser.add_argument("--images", type=int, default=0, help="images per configuration (default: per size)")
    parser.add_argument("--threads", type=int, default=1, help="CPU: torch threads per configuration")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(time_config(**json.loads(args.one))))
        return
    rows = []
    if args.device == "cuda":
        import torch

        assert torch.cuda.is_available(), "--device cuda: no CUDA device"
        n = args.images or 96
        print(f"R101-C4 (bottom-up-attention) on {torch.cuda.get_device_name(0)}, 600x1000 images, {n} per config")
        for batch, amp in ((1, "bf16"), (8, "bf16"), (16, "bf16"), (8, "fp16"), (8, None)):
            rows.append(time_config("butd_r101", "cuda", 600, 1000, n, batch, amp))
            torch.cuda.empty_cache()
        report(rows)
        best = max(r["images_per_s"] for r in rows)
        print(f"best: {best:.1f} images/s (target >= 20 on an H200)")
        return
    configs = [("mini", 192, 192, args.images or 32), ("mini", 600, 1000, args.images or 16)]
    if args.r101:
        configs.append(("butd_r101", 600, 1000, args.images or 2))
    for preset, h, w, n in configs:
        for batch in (1, 8 if preset == "mini" else 2):
            rows.append(in_subprocess({"preset": preset, "device": "cpu", "height": h, "width": w, "n": n,
                                       "batch": batch, "amp": None, "threads": args.threads}))
    report(rows)
    for h, w in ((192, 192), (600, 1000)):
        print(f"JPEG decode {h}x{w}: {decode_rate(h, w):.1f} images/s (one thread)")


if __name__ == "__main__":
    main()
