"""`make gpu-check DRY=1` inside `make test`: the GPU check's script runs end to end on the CPU with
tiny shapes, so it still works on the day a GPU turns up (docs/gpu.md)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from helpers.bench import run_bench

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

# every throughput figure the docs quote, by section
FIGURES = {
    "extraction": ["images_per_s", "regions_per_image"],
    "pretrain": ["tokens_per_s", "step_s", "gflop_per_step", "tflops", "mfu"],
    "finetune": ["steps_per_s", "examples_per_s"],
}
ENVIRONMENT = ["device", "torch", "cuda", "deepspeed", "date", "wall_s"]
GOALS = ["extraction_images_per_s", "pretrain_mfu", "numerics_bf16_vs_fp32"]


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_bench("gpu_check.py", *args, timeout=timeout)


def positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def test_dry_run_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    proc = run("--dry", "--out", str(out), "--profile", str(tmp_path / "profile"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    # --profile: the operator table of one task cycle, naming the matmuls the steps ran
    table = (tmp_path / "profile" / "pretrain_profile.txt").read_text()
    assert report["sections"]["pretrain"]["profile"].endswith("pretrain_profile.txt")
    assert "aten::" in table and ("aten::addmm" in table or "aten::mm" in table), table[:2000]

    assert report["dry"] is True
    assert all(report.get(k) not in (None, "") for k in ENVIRONMENT if k != "cuda"), report
    sections = report["sections"]
    assert set(sections) == {*FIGURES, "overflow_ab", "numerics"}
    for name, keys in FIGURES.items():
        assert "error" not in sections[name], sections[name]
        bad = {k: sections[name].get(k) for k in keys if not positive(sections[name].get(k))}
        assert not bad, f"{name}: not positive numbers: {bad}"

    # the overflow A/B: the stage's engine drops DeepSpeed's per-gradient pass, the other arm keeps it,
    # and both train identically (on the CPU to the bit: the same steps, the same losses)
    ab = sections["overflow_ab"]
    assert "error" not in ab, ab
    assert ab["check_grad_overflow"] is True and ab["pass_dropped_by_default"] is True, ab
    assert ab["steps_each"] >= 8 and ab["max_loss_diff"] == 0.0, ab
    assert positive(ab["norm_only"]["step_s"]) and positive(ab["deepspeed_pass"]["step_s"]), ab
    assert positive(ab["pass_over_norm_only"]), ab

    # numerics: fp32 vs bf16 (both on the CPU in a dry run) for every pretraining task, within tolerance
    num = sections["numerics"]
    assert set(num["losses"]) == {"mlm", "mrfr", "mrc", "mrc_kl", "itm"}
    for task, v in num["losses"].items():
        assert positive(v["fp32_cpu"]) and positive(v["bf16_cpu"]), (task, v)
        assert 0 <= v["rel_diff"] <= num["tolerance"], (task, v)
    assert num["pass"] is True

    goals = report["goals"]
    assert set(goals) == set(GOALS)
    # throughput goals are not judged on a dry run; the numerics goal is
    assert goals["extraction_images_per_s"]["met"] is None and goals["pretrain_mfu"]["met"] is None
    assert goals["numerics_bf16_vs_fp32"]["met"] is True


def test_full_run_without_a_gpu_says_so(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the full run would start")
    out = tmp_path / "gpu_check.json"
    proc = run("--out", str(out))
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stderr
    assert not out.exists()
