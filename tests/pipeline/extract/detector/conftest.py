"""Shared fixtures of the detector tests: small random detectors with calibrated norms."""

from __future__ import annotations

import pytest
import torch

from helpers.scene_kit import CLASS_NAMES, scene_images


@pytest.fixture(scope="module")
def mini_detector():
    """A random ``mini`` detector (64-px scale) whose norms are calibrated on a rendered scene."""
    from pipeline.extract.detector.build import Detector, build_model, calibrate_norms
    from pipeline.extract.detector.extractor import RegionExtractor

    torch.manual_seed(0)
    model, cfg = build_model("mini", num_classes=len(CLASS_NAMES), image_size=64)
    detector = Detector(model=model, cfg=cfg, preset="mini", class_names=list(CLASS_NAMES), attribute_names=[],
                        weights=None)
    images, _ = scene_images(2, seed=99)
    batch = torch.stack([RegionExtractor(detector).to_input(img)[0] for img in images])
    calibrate_norms(model, batch)
    return detector
