"""Stage ``finetune@<task>`` on small synthetic DBs with the tiny model: every task's train + eval loop,
the outputs and their formats, the NLVR2 variants, the scratch comparison, bad params; slow: a
run killed with SIGKILL resumes to byte-identical outputs.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.finetune_world import ROOT, budget, ft_params, world

from pipeline.common.runinfo import file_digest
from pipeline.params.finetune import TASK_SPLITS, TASKS

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return world(tmp_path_factory)


@pytest.fixture(scope="module")
def finished(data) -> dict:
    """Every task fine-tuned for 3 steps from the pretrained start (one process, in order)."""
    from pipeline.finetune.finetune import run

    return run(ft_params(data, *(budget(t) for t in TASKS)))


def tsv(path: Path) -> list[tuple[int, float]]:
    with path.open() as fh:
        return [(int(r[0]), float(r[1])) for r in list(csv.reader(fh, delimiter="\t"))[1:]]


@pytest.mark.parametrize("task", TASKS)
def test_each_task_trains_evaluates_and_writes_its_outputs(data, finished, task):
    record = finished[task]
    out = data / "models" / task
    assert {"model.safetensors", "model_config.json", "eval.json", "_run.json"} <= {p.name for p in out.iterdir()}
    assert json.loads((data / "metrics" / f"{task}.json").read_text()) == record
    assert not (data / "checkpoints" / "finetune" / task).exists()  # the work directory is gone
    assert record["steps"] == 3 and "scratch" not in record
    # the results table gets the test split (pooled where a task has several); dev stays in the record
    splits = TASK_SPLITS[task]
    assert {k.partition("/")[0] for k in record["summary"]} == {"+".join(splits.test)}
    assert set(splits.scored) <= set(record["pretrained"])
    for key, entry in record["summary"].items():
        split, _, name = key.partition("/")
        assert entry["pretrained"] == record["pretrained"][split][name]
        assert entry["chance"] == record["chance"][key]
        assert f"{splits.dev[0]}/{name}" in record["chance"]  # chance on dev too
        assert 0.0 <= entry["pretrained"] <= 100.0
    # the per-item scores of every summary metric average to the reported score (pipeline.training.paired)
    items = json.loads((out / "item_scores.json").read_text())
    assert set(items) == {"pretrained"} and set(record["summary"]) <= set(items["pretrained"])
    assert {k.partition("/")[0] for k in items["pretrained"]} >= set(splits.dev)  # dev too: splits are sized there
    for key, scored in items["pretrained"].items():
        assert len(scored["ids"]) == len(set(scored["ids"])) == len(scored["groups"]) == len(scored["scores"])
        assert len(set(scored["groups"])) <= len(scored["ids"])
        mean = 100.0 * sum(scored["scores"]) / len(scored["scores"]) if scored["ids"] else 0.0
        split, _, name = key.partition("/")
        assert mean == pytest.approx(record["pretrained"][split][name], abs=0.006)  # VQA's is rounded to 2 decimals
    run = json.loads((out / "_run.json").read_text())
    assert run["stage"] == f"finetune@{task}" and run["counts"]["resumed_from_step"] == {"pretrained": 0}
    assert set(run["timings_s"]["pretrained"]) >= {"train", "eval", "total"}
    losses = tsv(data / "metrics" / task / "pretrained" / "plots" / "metrics" / "train" / "loss.tsv")
    assert [s for s, _ in losses] == [1, 2, 3]


@pytest.mark.parametrize("task", TASKS)
def test_the_exported_model_reproduces_the_reported_metrics(data, finished, task):
    """model.safetensors + model_config.json rebuild the model that was evaluated (in the precision
    `_run.json` records: the stage evaluates in the precision it trained in)."""
    import torch
    from safetensors.torch import load_file

    from model.config import UniterConfig
    from pipeline.finetune.runner import encoder_in_precision
    from pipeline.finetune.tasks import task_class
    from pipeline.finetune.tasks.base import TaskContext

    params = ft_params(data, budget(task))
    config = json.loads((data / "models" / task / "model_config.json").read_text())
    t = task_class(task)(TaskContext(name=task, data=data, cfg=params.finetune, task_cfg=params.finetune.per_task[task],
                                     seed=params.seed))
    model = t.build_model(UniterConfig(**config["uniter_config"]), img_dim=config["img_dim"])
    model.load_state_dict(load_file(str(data / "models" / task / "model.safetensors")), strict=True)
    precision = json.loads((data / "models" / task / "_run.json").read_text())["precision"]
    with encoder_in_precision(model, precision, torch.device("cpu")) as evaluated:
        assert t.evaluate(evaluated, torch.device("cpu")).metrics == finished[task]["pretrained"]


def test_task_specific_outputs(data, finished):
    vqa = data / "models" / "vqa"
    from pipeline.stores.readers import TextDb

    for split in ("val", "test"):
        preds = json.loads((vqa / f"vqa_predictions_{split}.json").read_text())
        db = TextDb(data / "db" / "txt" / f"vqa_{split}")
        assert sorted(p["question_id"] for p in preds) == sorted(int(db[e]["question_id"]) for e in db.ids)
        vocab = json.loads((data / "db" / "txt" / "vqa_train" / "ans2label.json").read_text())
        assert all(isinstance(p["answer"], str) and p["answer"] in vocab for p in preds)
        # scored against the human answers of the manifest (test: from the evaluation-server file)
        assert finished["vqa"]["pretrained"][split]["questions"] == len(db)
        assert finished["vqa"]["pretrained"][split]["accuracy"] == pytest.approx(vqa_accuracy_by_hand(
            data, {str(p["question_id"]): p["answer"] for p in preds}), abs=1e-3)

    for split in ("val", "test"):
        vcr = finished["vcr"]["pretrained"][split]
        assert set(vcr) == {"q2a", "qa2r", "q2ar", "questions"} and vcr["q2ar"] <= min(vcr["q2a"], vcr["qa2r"])
    assert finished["vcr"]["chance"] == {f"{s}/{m}": v for s in ("val", "test")
                                         for m, v in (("q2a", 25.0), ("qa2r", 25.0), ("q2ar", 6.25))}

    ref = finished["refcoco_plus"]["pretrained"]
    assert set(ref) == {"val", "testA", "testB", "testA+testB"}
    assert all({"gt_accuracy", "det_accuracy"} <= set(m) for m in ref.values())
    for mode in ("gt", "det"):  # the reported test score pools the expressions of testA and testB
        n = ref["testA"][f"{mode}_examples"] + ref["testB"][f"{mode}_examples"]
        hits = sum(ref[s][f"{mode}_accuracy"] * ref[s][f"{mode}_examples"] for s in ("testA", "testB"))
        assert ref["testA+testB"][f"{mode}_examples"] == n
        assert ref["testA+testB"][f"{mode}_accuracy"] == pytest.approx(hits / n, abs=1e-3)
    oracle = finished["refcoco_plus"]["references"]["class_oracle"]
    assert oracle.pop("label").startswith("class oracle")
    assert oracle == pytest.approx(class_oracle_by_hand(data), abs=1e-3)

    retrieval = finished["retrieval_flickr"]
    for split in ("val", "test"):
        assert set(retrieval["zero_shot"][split]) >= {"ir_r1", "ir_r5", "ir_r10", "tr_r1", "tr_r5", "tr_r10", "r_mean"}
        images = retrieval["pretrained"][split]["images"]
        assert retrieval["chance"][f"{split}/ir_r1"] == pytest.approx(100.0 / images, abs=1e-3)
    assert retrieval["summary"]["test/ir_r1"]["zero_shot"] == retrieval["zero_shot"]["test"]["ir_r1"]


def vqa_accuracy_by_hand(data: Path, predicted: dict[str, str]) -> float:
    """VQA accuracy of ``predicted`` averaged by hand over the manifest questions it answers that have
    human answers (per question: the official formula, checked against the official tool in
    tests/pipeline/finetune/tasks/test_vqa_eval.py), rounded as the official tool reports it."""
    import pandas as pd

    from pipeline.finetune.tasks.vqa_eval import question_accuracy

    frame = pd.read_parquet(data / "manifests" / "vqa.parquet")
    scores = [question_accuracy(predicted[str(r.question_id)], list(r.answers)) for r in frame.itertuples(index=False)
              if str(r.question_id) in predicted and r.answers is not None]
    return round(100.0 * sum(scores) / len(scores), 2)


def class_oracle_by_hand(data: Path) -> dict[str, float]:
    """RefCOCO+'s class oracle recomputed from the DBs: per expression, the top class of the target's
    ground-truth box, then the most confident box (ground-truth or detected) with that top class."""
    import numpy as np

    from pipeline.stores.readers import ImageDbGroup, TextDb

    def iou(a, b) -> float:
        w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
        return w * h / area

    out, counts = {}, {}
    gt_db = TextDb(data / "db" / "txt" / "refcoco_plus_train").meta["gt_img_db"]
    group = ImageDbGroup(data / "db" / "img", ["coco", gt_db])
    for split in ("val", "testA", "testB"):
        db = TextDb(data / "db" / "txt" / f"refcoco_plus_{split}")
        hits = {"gt": 0, "det": 0}
        for e in db.ids:
            rec, (image,) = db[e], db.txt2img[e]
            if int(rec["target_index"]) < 0:
                continue
            gt = group[f"{gt_db}/{image.partition('/')[2]}"]
            cls = int(np.argmax(gt["soft_labels"][int(rec["target_index"])]))
            for mode, regions in (("gt", gt), ("det", group[image])):
                best, best_p = None, -1.0
                for box, probs in zip(regions["boxes"], regions["soft_labels"]):
                    if int(np.argmax(probs)) == cls and float(probs[cls]) > best_p:
                        best, best_p = box, float(probs[cls])
                hits[mode] += best is not None and iou(best.tolist(), list(rec["target_box"])) >= 0.5
        for mode in hits:
            out[f"{split}/{mode}_accuracy"] = round(100.0 * hits[mode] / len(db.ids), 4)
            counts[(split, mode)] = (hits[mode], len(db.ids))
    for mode in ("gt", "det"):
        hit, n = (counts[("testA", mode)][k] + counts[("testB", mode)][k] for k in (0, 1))
        out[f"testA+testB/{mode}_accuracy"] = round(100.0 * hit / n, 4)
    return out


@pytest.mark.parametrize("variant", ["triplet", "pair"])
def test_nlvr2_variants(data, variant):
    from pipeline.finetune.finetune import run

    record = run(ft_params(data, budget("nlvr2", steps=2), f"finetune.nlvr2_variant={variant}"), "nlvr2")["nlvr2"]
    config = json.loads((data / "models" / "nlvr2" / "model_config.json").read_text())
    assert config["task_info"] == {"variant": variant, "head": "linear"}
    assert set(record["pretrained"]) == {"dev", "test"}


def test_scratch_comparison_has_the_same_budget_and_head_start(data):
    from safetensors.torch import load_file

    from pipeline.finetune.finetune import run

    record = run(ft_params(data, budget("snli_ve", steps=4), "finetune.compare_scratch=true"), "snli_ve")["snli_ve"]
    entry = record["summary"]["test/accuracy"]
    assert entry["gain"] == pytest.approx(entry["pretrained"] - entry["scratch"])
    # both starts scored the same test items: the gain comes with its paired interval over them
    interval = entry["gain_interval"]
    assert interval["gain"] == pytest.approx(entry["gain"], abs=0.01)
    assert interval["low"] <= interval["gain"] <= interval["high"]
    assert interval["items"] == record["pretrained"]["test"]["examples"] >= interval["groups"]
    assert record["gain_intervals"]["test/accuracy"] == interval and "dev/accuracy" in record["gain_intervals"]
    items = json.loads((data / "models" / "snli_ve" / "item_scores.json").read_text())
    assert items["pretrained"]["test/accuracy"]["ids"] == items["scratch"]["test/accuracy"]["ids"]
    run_json = json.loads((data / "models" / "snli_ve" / "_run.json").read_text())
    assert run_json["counts"]["resumed_from_step"] == {"pretrained": 0, "scratch": 0}
    for init in ("pretrained", "scratch"):
        assert len(tsv(data / "metrics" / "snli_ve" / init / "plots" / "metrics" / "train" / "loss.tsv")) == 4
    # the fine-tuned weights are the pretrained start's (the scratch model is only measured)
    state = load_file(str(data / "models" / "snli_ve" / "model.safetensors"))
    assert "uniter.embeddings.word_embeddings.weight" in state and "head.3.weight" in state


def test_parallel_starts_give_what_one_thread_gives_one_after_the_other(data):
    """finetune.parallel_starts trains each start in a child process with half the cores (here 1
    thread on 2 cores): the metrics, curves and weights are those of the same starts trained one
    after the other in this process with the same one thread."""
    import torch

    from pipeline.finetune.finetune import run

    overrides = (budget("snli_ve", steps=4), "finetune.compare_scratch=true")
    outputs = ("models/snli_ve/model.safetensors", "models/snli_ve/eval.json", "metrics/snli_ve.json",
               *(f"metrics/snli_ve/{init}/plots/metrics/train/loss.tsv" for init in ("pretrained", "scratch")))
    threads = max(1, (os.cpu_count() or 1) // 2)
    parallel = run(ft_params(data, *overrides, "finetune.parallel_starts=true"), "snli_ve")["snli_ve"]
    digests = {name: file_digest(data / name) for name in outputs}
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        sequential = run(ft_params(data, *overrides, "finetune.parallel_starts=false"), "snli_ve")["snli_ve"]
    finally:
        torch.set_num_threads(saved)
    assert parallel == sequential and set(parallel["summary"]["test/accuracy"]) >= {"pretrained", "scratch"}
    assert {name: file_digest(data / name) for name in outputs} == digests


def test_scratch_region_projection_is_random_unless_asked_to_start_as_pretraining(data):
    """UNITER's no-pretraining baseline has nothing of the pretraining stage, the class-name fit of
    the region projection included; finetune.scratch_region_init=as_pretraining gives it that fit."""
    from pipeline.finetune.finetune import open_task, run_plan

    def scratch_plan(*overrides: str):
        params = ft_params(data, *overrides)
        return run_plan(params, open_task(params, "snli_ve"), "scratch")

    fit = ("model.region_init=class_names", "model.region_init_images=5")
    plans = {mode: scratch_plan(*fit, f"finetune.scratch_region_init={mode}")
             for mode in ("random", "as_pretraining")}
    assert ft_params(data, *fit).finetune.scratch_region_init == "random"
    assert plans["random"].region_init_images == 0 and plans["as_pretraining"].region_init_images == 5
    assert plans["random"].fingerprint != plans["as_pretraining"].fingerprint
    # under model.region_init=random there is no fit to copy
    unfitted = scratch_plan("finetune.scratch_region_init=as_pretraining", "model.region_init=random")
    assert unfitted.region_init_images == 0


def test_scratch_start_gets_the_region_projection_start_pretraining_had(data):
    """scratch_region_init=as_pretraining: the non-pretrained start fits its region projection
    exactly as the pretraining stage does, so the comparison isolates what pretraining learned."""
    import torch

    from pipeline.finetune.finetune import encoder_config
    from pipeline.finetune.tasks import task_class
    from pipeline.finetune.tasks.base import TaskContext
    from pipeline.finetune.runner import RunPlan, build_model
    from pipeline.pretrain.plan import plan_stage
    from pipeline.pretrain.pretrain import _build_model
    from pipeline.stores.text_sources import open_sources
    from pipeline.training.model_io import read_exported

    params = ft_params(data, "model.region_init=class_names", "model.region_init_images=5")
    pretraining = plan_stage(params, "pretrain")
    cfg = params.finetune
    task = task_class("snli_ve")(TaskContext(name="snli_ve", data=data, cfg=cfg, task_cfg=cfg.per_task["snli_ve"],
                                             seed=params.seed))
    task.open()
    meta, _ = read_exported(data / "models" / "pretrain")
    plans = {n: RunPlan(init="scratch", work_dir=data / "unused", config=encoder_config(meta, 0.0),
                        img_dim=task.img_dbs.feature_dim, init_state=None, scratch_init="random", bert_checkpoint=None,
                        fingerprint={}, region_init_images=n, region_sources=pretraining.train_sources,
                        img_root=pretraining.img_root) for n in (0, 5)}
    plain, fitted = (build_model(task, plans[n], seed=params.seed) for n in (0, 5))
    # what the pretraining stage itself starts from: fitted on its training images only
    train_dbs, img_dbs = open_sources(pretraining.train_sources, pretraining.img_root)
    reference, _, region_fit = _build_model(params, pretraining, train_dbs, img_dbs)
    assert region_fit is not None
    proj = "uniter.img_embeddings.feat_proj"
    for part in ("weight", "bias"):
        assert torch.equal(fitted.state_dict()[f"{proj}.{part}"], reference.state_dict()[f"uniter.img_embeddings.feat_proj.{part}"])
    proj = f"{proj}.weight"
    assert not torch.equal(fitted.state_dict()[proj], plain.state_dict()[proj])
    # everything else is the same seeded start
    for name, value in plain.state_dict().items():
        if "feat_proj" not in name:
            assert torch.equal(value, fitted.state_dict()[name]), name


def test_bad_params_and_missing_inputs_are_named(data, tmp_path):
    from pipeline.finetune.finetune import run
    from pipeline.params.parser import ParamsError

    with pytest.raises(ParamsError, match="finetune: unknown task 'vqa2'"):
        run(ft_params(data), "vqa2")
    with pytest.raises(ValueError, match="retrieval_neg_pool must be >= finetune.retrieval_hard_negatives"):
        run(ft_params(data, "finetune.retrieval_neg_pool=1", "finetune.retrieval_hard_negatives=2"), "snli_ve")
    empty = tmp_path / "data"
    shutil.copytree(data / "db", empty / "db")
    with pytest.raises(FileNotFoundError, match="pretrain/model_config.json not found"):
        run(ft_params(empty, budget("snli_ve")), "snli_ve")
    with pytest.raises(FileNotFoundError, match="text DB .*nlvr2_train not found"):
        run(ft_params(tmp_path / "nothing", budget("nlvr2")), "nlvr2")


def test_the_start_follows_pretrain_out_name(data, tmp_path):
    """pretrain.out_name names the pretraining outputs; fine-tuning reads the ones it names (an
    experiment with its own out_name must not silently fine-tune the default model)."""
    from pipeline.finetune.finetune import run

    other = tmp_path / "data"
    shutil.copytree(data / "db", other / "db")
    with pytest.raises(FileNotFoundError, match="exp1/model_config.json not found"):
        run(ft_params(other, budget("snli_ve", steps=1), "pretrain.out_name=exp1"), "snli_ve")
    shutil.copytree(data / "models" / "pretrain", other / "models" / "exp1")
    record = run(ft_params(other, budget("snli_ve", steps=1), "pretrain.out_name=exp1"), "snli_ve")["snli_ve"]
    config = json.loads((other / "models" / "snli_ve" / "model_config.json").read_text())
    assert config["init"] == str(other / "models" / "exp1") and record["steps"] == 1


def test_results_stage_reads_what_finetune_wrote(data, finished):
    from pipeline.report.results import run

    results = run(ft_params(data))
    assert [r["task"] for r in results["rows"]] == ["vqa", "vcr", "nlvr2", "snli_ve", "retrieval_flickr",
                                                    "retrieval_flickr", "refcoco_plus"]
    assert results["meta_sum"]["pretrained"] == pytest.approx(sum(r["pretrained"] for r in results["rows"]), abs=1e-3)
    md = (data / "reports" / "results.md").read_text()
    assert "| **Meta-Sum** |" in md and "Flickr test TR R@1" in md
    # every row is a test split; nothing says a task fell back to dev
    assert [r["metric"].partition("/")[0] for r in results["rows"]] == ["test"] * 6 + ["testA+testB"]
    assert all(r["split"] == "test" for r in results["rows"]) and "(dev:" not in md


def test_without_evaluation_server_files_vqa_and_vcr_report_dev_and_vqa_writes_the_submission(tmp_path_factory):
    """Real data: VQA and VCR test labels are not public. The test split is then predicted (VQA: the
    submission file for the evaluation server) but not scored, and the results table reports dev."""
    from pipeline.finetune.finetune import run
    from pipeline.report.results import run as results
    from pipeline.stores.readers import TextDb

    data = world(tmp_path_factory, test_labels=False)
    params = ft_params(data, *(budget(t, steps=1) for t in TASKS))
    for task, metric in (("vqa", "accuracy"), ("vcr", "q2ar")):
        record = run(params, task)[task]
        assert set(record["summary"]) == {f"val/{metric}"} and set(record["pretrained"]) == {"val"}
        assert all(k.startswith("val/") for k in record["chance"])
    preds = json.loads((data / "models" / "vqa" / "vqa_predictions_test.json").read_text())
    test_db = TextDb(data / "db" / "txt" / "vqa_test")
    assert len(test_db) and sorted(p["question_id"] for p in preds) == sorted(int(test_db[e]["question_id"])
                                                                             for e in test_db.ids)
    table = results(ft_params(data, "finetune.tasks=[vqa, vcr]"))
    assert [(r["metric"], r["split"]) for r in table["rows"]] == [("val/accuracy", "dev"), ("val/q2ar", "dev")]
    md = (data / "reports" / "results.md").read_text()
    assert md.count("(dev: no test labels)") == 2 and "evaluation server" in md


# ------------------------------------------------------------------------------------------
# kill and resume (slow): the real CLI in subprocesses


def _cli(data: Path, *overrides: str) -> list[str]:
    from helpers.finetune_world import FAST

    sets = [a for o in (f"paths.data={data}", *FAST, *overrides) for a in ("--set", o)]
    return [sys.executable, "-m", "pipeline", "finetune", "retrieval_flickr", *sets]


def _env() -> dict[str, str]:
    return {**os.environ, "DS_ACCELERATOR": "cpu", "DVC_NO_ANALYTICS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.slow
def test_killed_run_resumes_to_identical_outputs(data):
    """SIGKILL mid-training (the scratch start, after the pretrained one finished), rerun: the same
    bytes as an uninterrupted run. Retrieval exercises two streams and the hard-negative pools."""
    steps = 16  # room after step 5 for the kill to land mid-run: a tiny-model step takes a few tens of ms
    common = (budget("retrieval_flickr", steps=steps), "finetune.checkpoint_every=3", "finetune.compare_scratch=true",
              "finetune.val_every=4", "finetune.parallel_starts=false")  # the starts in turn: kill the second
    outputs = ("models/retrieval_flickr/model.safetensors", "models/retrieval_flickr/eval.json",
               "metrics/retrieval_flickr.json", "metrics/retrieval_flickr/scratch/plots/metrics/train/loss.tsv")
    subprocess.run(_cli(data, *common), cwd=ROOT, env=_env(), check=True, capture_output=True)
    reference = {name: file_digest(data / name) for name in outputs}
    shutil.rmtree(data / "models" / "retrieval_flickr")
    shutil.rmtree(data / "metrics" / "retrieval_flickr")

    loss = data / "checkpoints/finetune/retrieval_flickr/scratch/live/plots/metrics/train/loss.tsv"
    proc = subprocess.Popen(_cli(data, *common), cwd=ROOT, env=_env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    try:
        while not (loss.exists() and any(s >= 5 for s, _ in tsv(loss))):
            assert proc.poll() is None, f"the run ended (status {proc.returncode}) before it could be killed"
            assert time.time() < deadline, "step 5 of the scratch start not reached in 300 s"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert (data / "checkpoints/finetune/retrieval_flickr/pretrained/result/result.json").exists()
    subprocess.run(_cli(data, *common), cwd=ROOT, env=_env(), check=True, capture_output=True)

    run = json.loads((data / "models/retrieval_flickr/_run.json").read_text())
    # killed once step 5 was logged: from the step-3 checkpoint, or a later one when the kill lands
    # steps late (the poll's own interval is 0.1 s); never from scratch, nor after the last step
    assert run["counts"]["resumed_from_step"]["scratch"] in range(3, steps, 3)
    for name, digest in reference.items():
        assert file_digest(data / name) == digest, name
