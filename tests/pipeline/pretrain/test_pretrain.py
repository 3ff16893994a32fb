"""The pretraining stages end to end on small synthetic DBs (build_dbs' test world) with the tiny model.

One process in-process (fast), plus slow tests that run the real CLI: a run killed with SIGKILL
and resumed reproduces the uninterrupted run exactly, and two CPU ranks through the deepspeed
launcher.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.dbs_synthetic import ROOT, built_world, params_for
from pipeline.common.ownership import OWNER_FILE
from pipeline.common.runinfo import file_digest

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

FAST = ["model.preset=tiny", "model.init_from_bert=false", "pretrain.batch_tokens=400", "pretrain.val_batches=2",
        "pretrain.log_every=1", "pretrain.optim.lr=0.005", "pretrain.optim.warmup_steps=2", "pretrain.num_workers=0",
        "pretrain.vcr.lr=0.002", "pretrain.vcr.warmup_steps=1", "pretrain.first_phase_steps=0"]


def tsv(path: Path) -> list[tuple[int, str]]:
    with path.open() as fh:
        return [(int(r[0]), r[1]) for r in list(csv.reader(fh, delimiter="\t"))[1:]]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return built_world(tmp_path_factory.mktemp("pretrain") / "data")


@pytest.fixture(scope="module")
def first_stage(data) -> Path:
    from pipeline.pretrain.pretrain import run

    run(params_for(data, *FAST, "pretrain.steps=16", "pretrain.val_every=8", "pretrain.checkpoint_every=5"))
    return data / "models" / "pretrain"


def test_first_stage_learns_exports_and_cleans_up(data, first_stage):
    from pipeline.pretrain.plan import plan_stage
    from pipeline.pretrain.inputs import held_out_batches
    from pipeline.stores.text_sources import open_sources
    from pipeline.training.engine import autocast_forward, resolve_precision
    from pipeline.training.metrics import evaluate
    from pipeline.training.model_io import model_from_export
    from pipeline.training.task_mix import TaskSchedule

    params = params_for(data, *FAST, "pretrain.steps=16")
    assert sorted(p.name for p in first_stage.iterdir()) == [OWNER_FILE, "_run.json", "eval.json",
                                                             "model.safetensors", "model_config.json"]
    assert not (data / "checkpoints" / "pretrain").exists()  # removed once the export is written

    mlm = [float(v) for _, v in tsv(data / "metrics/pretrain/plots/metrics/train/mlm/loss.tsv")]
    assert len(mlm) >= 4 and mlm[-1] < mlm[0] - 0.2, mlm
    live = json.loads((data / "metrics/pretrain/metrics.json").read_text())
    assert live["step"] == 16 and {"lr", "tokens_per_s", "loss"} <= set(live["train"])
    assert {"itm_acc", "ot_dist"} <= set(live["val"]["itm"]) and "mrc_acc" in live["val"]["mrc_kl"]

    report = json.loads((first_stage / "eval.json").read_text())
    assert set(report["pretrained"]) == {"itm", "mlm", "mrc_kl", "mrfr"}
    assert report["pretrained"]["mlm"]["loss"] < report["no_pretraining"]["mlm"]["loss"] - 0.2
    itm = report["held_out"]["itm"]
    assert itm["batches"] <= 2 and 0 < itm["matched"] < itm["examples"]
    run = json.loads((first_stage / "_run.json").read_text())
    assert run["counts"]["task_steps"] == TaskSchedule(params.pretrain.mix_ratio, seed=params.seed).counts(16)
    # UNITER's fixed dataset ratios (COCO:VG 1:1 by default): one stream per (task, dataset)
    assert report["recipe"] == "project" and report["dataset_ratio"] == {"coco": 1.0, "vg": 1.0}
    streams = run["counts"]["stream_steps"]
    assert sum(streams.values()) == 16 and {s.split("/")[1] for s in streams} == {"coco", "vg"}
    assert set(run["counts"]["train_examples"]) == set(streams)
    phases = run["timings_s"]  # where the wall time went, phase by phase
    assert set(phases) == {"startup", "baseline_eval", "train", "validation", "checkpoint", "final_eval",
                           "text_only_eval", "export"} and min(phases.values()) >= 0 and phases["train"] > 0

    # the export loads strictly and reproduces the held-out metrics the stage measured at its last step
    plan = plan_stage(params, "pretrain")
    val_dbs, img_dbs = open_sources(plan.val_sources, plan.img_root)
    val = held_out_batches(val_dbs, img_dbs, plan.eval_tasks, seed=params.seed, mask_prob=0.15, itm_neg_prob=0.5,
                           batch_tokens=400, n_batches=None, rank=0, world_size=1)
    # eval.json measures every val example (pretrain.eval_batches 0), not the 2 curve batches
    assert report["held_out"]["itm"]["examples"] == sum(int(b["input_ids"].shape[0]) for b in val["itm"])
    vocab = json.loads((first_stage / "model_config.json").read_text())["uniter_config"]["vocab_size"]
    model, _ = model_from_export(first_stage, vocab_size=vocab, img_dim=img_dbs.feature_dim,
                                 num_classes=img_dbs.num_classes)
    # in the precision the stage measured in (bf16 autocast on a CPU with native bf16)
    import torch

    cpu = torch.device("cpu")
    autocast_forward(model, resolve_precision(params.pretrain.precision, cpu), cpu)
    again = evaluate(model, val, prepare=lambda b: b, module=model)
    for task, metrics in report["pretrained"].items():
        for name, value in metrics.items():
            assert again[f"val/{task}/{name}"] == pytest.approx(value, rel=1e-4, abs=1e-6), (task, name)


def test_vcr_stage_starts_from_the_first_and_uses_both_views(data, first_stage):
    from pipeline.pretrain.pretrain import run_vcr
    from pipeline.stores.readers import TextDb
    from pipeline.stores.vcr_views import GoldAnswerView, GoldRationaleView

    run_vcr(params_for(data, *FAST, "pretrain.vcr.steps=6", "pretrain.val_every=0", "pretrain.checkpoint_every=0"))
    out = data / "models" / "pretrain_vcr"
    report = json.loads((out / "eval.json").read_text())
    assert set(report["pretrained"]) == {"mlm", "mrc_kl", "mrfr"}  # no ITM in the second stage
    run = json.loads((out / "_run.json").read_text())
    labelled = sum(TextDb(data / "db/txt/vcr_qa_train")[e]["label"] >= 0 for e in TextDb(data / "db/txt/vcr_qa_train").ids)
    qar = len(GoldRationaleView(TextDb(data / "db/txt/vcr_qar_train")))
    assert run["counts"]["train_examples"]["mlm"] == labelled + qar  # Q→A and QA→R side by side
    assert run["input_digests"]["init"] == file_digest(first_stage / "model.safetensors")
    view = GoldAnswerView(TextDb(data / "db/txt/vcr_qa_train"))
    special = view.meta["special_ids"]
    for eid in view.ids:  # Q→A text = [CLS] question [SEP] gold answer [SEP], types 0 / 2
        raw = TextDb(data / "db/txt/vcr_qa_train")[eid]
        q, a = list(raw["input_ids"]), list(raw["choices"][raw["label"]])
        want = [special["cls"], *q, special["sep"], *a, special["sep"]]
        assert view[eid]["input_ids"].tolist() == want and view.id2len[eid] == len(want) - 2
        assert view[eid]["txt_type_ids"].tolist() == [0] * (len(q) + 1) + [2] * (len(a) + 2)
    first = json.loads((first_stage / "model_config.json").read_text())
    vcr_config = json.loads((out / "model_config.json").read_text())["uniter_config"]
    assert vcr_config == {**first["uniter_config"], "type_vocab_size": 4}  # + answer and rationale types


def test_masking_ablation_is_the_first_stage_with_the_other_masking(data, first_stage):
    from pipeline.pretrain.pretrain import run_masking_ablation

    run_masking_ablation(params_for(data, *FAST, "pretrain.steps=16", "pretrain.val_every=8",
                                    "pretrain.checkpoint_every=5"))
    out = data / "models" / "pretrain_masking_ablation"
    first, other = (json.loads((d / "eval.json").read_text()) for d in (first_stage, out))
    assert (first["masking"], other["masking"]) == ("conditional", "joint")
    assert other["stage"] == "pretrain_masking"
    # same start, same held-out batches, same task sequence: only the training masks differ
    assert other["held_out"] == first["held_out"] and other["no_pretraining"] == first["no_pretraining"]
    runs = [json.loads((d / "_run.json").read_text())["counts"] for d in (first_stage, out)]
    assert runs[0]["task_sequence_sha256_by_rank"] == runs[1]["task_sequence_sha256_by_rank"]
    assert other["pretrained"] != first["pretrained"]
    live = json.loads((data / "metrics/pretrain_masking_ablation/metrics.json").read_text())
    assert live["step"] == 16


def test_first_phase_runs_its_own_mix_first(data, tmp_path):
    from pipeline.pretrain.pretrain import run
    from pipeline.training.task_mix import TaskSchedule

    params = params_for(data, *FAST, "pretrain.steps=6", "pretrain.first_phase_steps=4", "pretrain.val_every=0",
                        "pretrain.checkpoint_every=0", "pretrain.out_name=phased",
                        "pretrain.mix_ratio={mlm: 3.0, itm: 0.1}", "pretrain.first_phase_dropout=0.0")
    run(params)
    report = json.loads((data / "models/phased/eval.json").read_text())
    assert report["first_phase"] == {"steps": 4, "mix_ratio": {"itm": 1.0}, "dropout": 0.0}
    counts = json.loads((data / "models/phased/_run.json").read_text())["counts"]["task_steps"]
    expected = TaskSchedule({"mlm": 3.0, "itm": 0.1}, seed=params.seed, first_phase_mix={"itm": 1.0},
                            first_phase_steps=4).counts(6)
    assert counts == expected and counts["itm"] >= 4
    itm_steps = [step for step, _ in tsv(data / "metrics/phased/plots/metrics/train/itm/loss.tsv")]
    assert itm_steps[:4] == [1, 2, 3, 4]  # log_every=1: ITM ran at steps 1-4


def test_first_phase_never_adds_a_task_the_mix_has_off(data):
    from pipeline.pretrain.pretrain import run

    run(params_for(data, *FAST, "pretrain.steps=4", "pretrain.first_phase_steps=2", "pretrain.val_every=0",
                   "pretrain.checkpoint_every=0", "pretrain.out_name=mlm_only", "pretrain.mix_ratio={mlm: 1.0}"))
    assert json.loads((data / "models/mlm_only/eval.json").read_text())["first_phase"] is None
    assert json.loads((data / "models/mlm_only/_run.json").read_text())["counts"]["task_steps"] == {"mlm": 4}


def test_bad_params_are_named(data):
    from pipeline.pretrain.pretrain import run, run_vcr

    with pytest.raises(ValueError, match=r"pretrain.mix_ratio: task\(s\) \['mlmm'\]"):
        run(params_for(data, *FAST, "pretrain.mix_ratio={mlmm: 1.0}"))
    with pytest.raises(ValueError, match=r"not allowed in pretrain_vcr"):
        run_vcr(params_for(data, *FAST, "pretrain.vcr.mix_ratio={itm: 1.0}"))
    with pytest.raises(ValueError, match=r"first_phase_mix: task\(s\) \['itmm'\]"):
        run(params_for(data, *FAST, "pretrain.first_phase_steps=2", "pretrain.first_phase_mix={itmm: 1.0}"))
    with pytest.raises(ValueError, match="zero_stage must be 0, 1 or 2"):
        run(params_for(data, *FAST, "pretrain.zero_stage=3"))
    with pytest.raises(FileNotFoundError, match="pretrain_outdomain_train"):
        run(params_for(data.parent / "nothing", *FAST, "pretrain.datasets=outdomain"))


def test_a_full_disk_at_the_export_is_one_line_and_leaves_no_model(data, monkeypatch):
    from helpers.disk_full import fill_disk_at
    from pipeline.common.failures import MACHINE_STATE, describe
    from pipeline.pretrain.pretrain import run

    fill_disk_at(monkeypatch, "model.safetensors")
    with pytest.raises(OSError) as info:
        run(params_for(data, *FAST, "pretrain.steps=2", "pretrain.val_every=0", "pretrain.checkpoint_every=0",
                       "pretrain.out_name=full_disk"))
    status, line = describe(info.value)
    assert status == MACHINE_STATE and line.startswith(f"disk full: {data}/models/.full_disk.") and "\n" not in line
    assert not list((data / "models").glob("*full_disk*"))  # neither the model nor its temporary directory


# ------------------------------------------------------------------------------------------
# the CLI in subprocesses (slow)


def _cli(data: Path, *overrides: str, stage: str = "pretrain") -> list[str]:
    sets = [a for o in (f"paths.data={data}", *FAST, *overrides) for a in ("--set", o)]
    return [sys.executable, "-m", "pipeline", stage, *sets]


def _env() -> dict[str, str]:
    return {**os.environ, "DS_ACCELERATOR": "cpu", "DVC_NO_ANALYTICS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _complete(cmd: list[str]) -> None:
    result = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(cmd[3:5])} failed with status {result.returncode}:\n{result.stderr[-4000:]}")


def _run_until_killed(cmd: list[str], loss_file: Path, *, kill_after_step: int, timeout: float = 300) -> None:
    """Start ``cmd`` in its own process group; SIGKILL the whole group once ``loss_file`` shows the step."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"the run ended (status {proc.returncode}) before step {kill_after_step} was seen")
            if loss_file.exists() and any(s >= kill_after_step for s, _ in tsv(loss_file)):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"step {kill_after_step} not reached in {timeout}s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_killed_run_resumes_to_the_identical_result(data):
    # the kill and the resumed checkpoint fall inside the ITM-first phase, the end after it
    common = ("pretrain.steps=14", "pretrain.first_phase_steps=5", "pretrain.checkpoint_every=4", "pretrain.val_every=7")
    _complete(_cli(data, *common, "pretrain.out_name=reference"))
    killed = _cli(data, *common, "pretrain.out_name=killed")
    loss = data / "metrics/killed/plots/metrics/train/loss.tsv"
    _run_until_killed(killed, loss, kill_after_step=6)
    assert any((data / "checkpoints/killed").glob("step_*/COMPLETE"))
    _complete(killed)

    run = json.loads((data / "models/killed/_run.json").read_text())
    assert run["counts"]["resumed_from_step"] >= 4
    reference = data / "metrics/reference/plots/metrics"
    for name in ("train/loss.tsv", "train/mlm/loss.tsv", "val/mlm/mlm_acc.tsv"):
        assert tsv(data / "metrics/killed/plots/metrics" / name) == tsv(reference / name), name
    for name in ("model.safetensors", "eval.json"):
        assert file_digest(data / "models/killed" / name) == file_digest(data / "models/reference" / name), name


@pytest.mark.slow
def test_two_cpu_ranks_through_the_deepspeed_launcher(data):
    cmd = _cli(data, "pretrain.world_size=2", "pretrain.steps=10", "pretrain.checkpoint_every=4",
               "pretrain.val_every=5", "pretrain.out_name=two_ranks")
    _run_until_killed(cmd, data / "metrics/two_ranks/plots/metrics/train/loss.tsv", kill_after_step=6)
    assert len(list((data / "checkpoints/two_ranks").glob("step_*/trainer_state_rank*.pt"))) >= 2
    _complete(cmd)  # resumes both ranks

    run = json.loads((data / "models/two_ranks/_run.json").read_text())
    assert run["counts"]["world_size"] == 2 and run["counts"]["resumed_from_step"] >= 4
    first, second = run["counts"]["task_sequence_sha256_by_rank"]
    assert first == second  # both ranks ran the same task at every step
    mlm = [float(v) for _, v in tsv(data / "metrics/two_ranks/plots/metrics/train/mlm/loss.tsv")]
    assert mlm[-1] < mlm[0]
