"""Where ``train_detector`` leaves the mini world's detector, read by ``extract`` (its weights) and
by the ``results`` stage (its held-out quality). No torch or detectron2 here: the results stage
imports it."""

from __future__ import annotations

from pathlib import Path

WEIGHTS_FILE = "model_final.pth"  # {"model": state_dict, "meta": class names, image size, ...}
METRICS_FILE = "metrics.json"  # held-out quality, training stats, targets and whether they were met


def detector_dir(data: Path | str) -> Path:
    """``<data>/models/detector``: train_detector's output folder."""
    return Path(data) / "models" / "detector"
