"""scripts/gpu_carry.py: which imported packages travel to a lent GPU machine, and how."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gpu_carry():
    spec = importlib.util.spec_from_file_location("gpu_carry", REPO / "scripts" / "gpu_carry.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_image_builds_of_torch_and_numpy_never_travel(gpu_carry):
    assert {"torch", "torchvision", "triton", "numpy", "functorch", "torchgen"} <= gpu_carry.DEVICE_HAS


def test_compiled_is_told_from_pure_python(gpu_carry):
    assert gpu_carry.is_compiled(gpu_carry.site_packages_module("lmdb"))
    assert not gpu_carry.is_compiled(gpu_carry.site_packages_module("yacs"))
    assert gpu_carry.site_packages_module("no_such_module_here") is None


def test_missing_pure_python_packages_are_copied(gpu_carry, monkeypatch, tmp_path):
    # what the check imported: a stdlib module, a project module, one the image has, two it lacks
    monkeypatch.setattr(gpu_carry, "imported_top_level", lambda: {"json", "pipeline", "torch", "yacs", "hjson"})
    assert gpu_carry.main(["--out", str(tmp_path / "carry")]) == 0
    manifest = json.loads((tmp_path / "carry" / "manifest.json").read_text())
    assert [(e["module"], e["how"]) for e in manifest] == [("hjson", "copied"), ("yacs", "copied")]
    site = tmp_path / "carry" / "site"
    assert sorted(p.name for p in site.iterdir()) == ["hjson", "yacs"]
    assert not list(site.rglob("__pycache__"))
    # the copy imports on its own, ahead of the venv's (a fresh process: this one may hold yacs already)
    out = subprocess.run([sys.executable, "-c", "import yacs.config; print(yacs.config.__file__)"],
                         env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()).is_relative_to(site)
