"""The training loop on a real DeepSpeed engine (CPU, gloo) with a toy model: it learns, it resumes
exactly after a crash at an arbitrary step, and it exports the consolidated weights."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipeline.training.checkpointing import Checkpointer, consolidated_state_dict, save_safetensors
from pipeline.training.engine import EngineSettings, initialize
from pipeline.training.launch import process_group
from pipeline.training.loop import LoopSettings, train
from pipeline.training.metrics import MetricsLogger
from pipeline.training.streams import BatchStream
from pipeline.training.task_mix import TaskSchedule

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)


class Crash(RuntimeError):
    pass


class CrashingStream(BatchStream):
    """A stream that dies after handing out ``budget`` batches in total (a simulated kill)."""

    budget: list[int]

    def next_batch(self):
        if self.budget[0] <= 0:
            raise Crash
        self.budget[0] -= 1
        return super().next_batch()


def run_toy(toy, out: Path, *, total: int, zero_stage: int = 2, crash_after: int | None = None,
            checkpoint_every: int = 4, seed: int = 3, model_cls=None, first_phase: tuple[int, float] | None = None):
    """Train the toy for ``total`` steps (resuming whatever ``out`` holds); returns (engine state, result).
    ``first_phase``: (steps, dropout) of a ``tok``-only first phase with that dropout."""
    torch.manual_seed(seed)
    with process_group("cpu") as dist:
        model = (model_cls or toy.Model)()
        settings = EngineSettings(device=torch.device("cpu"), precision="fp32", world_size=1, zero_stage=zero_stage,
                                  grad_accum=2, grad_clip=1.0, lr=3e-2, betas=(0.9, 0.98), weight_decay=0.01,
                                  warmup_steps=3, total_steps=total)
        engine = initialize(model, settings)
        budget = [crash_after if crash_after is not None else 10**9]
        streams = {}
        for k, task in enumerate(("reg", "tok")):
            ds = toy.Dataset(64, seed=seed + k)
            cls = CrashingStream
            st = cls(ds, toy.Sampler(ds.lengths, max_tokens=48, seed=seed + k), toy.collate, seed=seed + k, name=task)
            st.budget = budget
            streams[task] = st
        val_ds = toy.Dataset(16, seed=99)
        val = {"tok": [toy.collate([val_ds[i] for i in range(j, j + 4)]) for j in range(0, 16, 4)]}
        ckpt = Checkpointer(out / "ckpt", stage="toy", fingerprint={"toy": 1, "total": total}, keep=2, dist=dist)
        resume = ckpt.prepare()
        logger = MetricsLogger(out / "live", stage="toy", enabled=True, resume_step=resume, params={"total": total})
        try:
            phase_steps, phase_dropout = first_phase or (0, None)
            schedule = TaskSchedule({"tok": 2.0, "reg": 1.0}, seed=seed, first_phase_mix={"tok": 1.0},
                                    first_phase_steps=phase_steps)
            result = train(engine, schedule=schedule, streams=streams,
                           checkpointer=ckpt, logger=logger, val_batches=val, dist=dist,
                           settings=LoopSettings(total_steps=total, grad_accum=2, log_every=1, val_every=5,
                                                 checkpoint_every=checkpoint_every, device=torch.device("cpu"),
                                                 precision="fp32", first_phase_dropout=phase_dropout),
                           resume_step=resume)
        finally:
            logger.close()
        export = consolidated_state_dict(engine, out / "ckpt", total, zero_stage)
        save_safetensors(export, out / "model.safetensors")
        module_state = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    return module_state, result


def read_tsv(path: Path) -> list[tuple[int, str]]:
    with path.open() as fh:
        rows = list(csv.reader(fh, delimiter="\t"))
    return [(int(r[0]), r[1]) for r in rows[1:]]


def test_loop_learns_resumes_exactly_and_exports(toy, tmp_path):
    total = 14
    full_state, full = run_toy(toy, tmp_path / "full", total=total)
    losses = read_tsv(tmp_path / "full/live/plots/metrics/train/loss.tsv")
    assert [s for s, _ in losses] == list(range(1, total + 1))
    tok = [float(v) for _, v in read_tsv(tmp_path / "full/live/plots/metrics/train/tok/loss.tsv")]
    assert sum(tok[-3:]) / 3 < 0.8 * sum(tok[:3]) / 3, tok  # it learns
    assert "val/tok/tok_acc" in full.last_val

    # crash in the middle of step 7 (after 13 micro-batches; last checkpoint at step 4), resume
    crashed = tmp_path / "crashed"
    with pytest.raises(Crash):
        run_toy(toy, crashed, total=total, crash_after=13)
    assert (crashed / "ckpt/step_0000004/COMPLETE").exists()
    resumed_state, resumed = run_toy(toy, crashed, total=total)
    assert resumed.start_step == 4
    assert read_tsv(crashed / "live/plots/metrics/train/loss.tsv") == losses  # bit-exact (as printed)
    for key in full_state:
        assert torch.equal(full_state[key], resumed_state[key]), key
    assert resumed.last_val == full.last_val

    # only the newest `keep` checkpoints remain; the export equals the trained module, tied weights kept
    steps = sorted(p.name for p in (tmp_path / "full/ckpt").glob("step_*"))
    assert steps == ["step_0000012", "step_0000014"]
    exported = load_file(tmp_path / "full/model.safetensors")
    assert set(exported) == set(full_state)
    for key, value in full_state.items():
        expected = value.float() if value.is_floating_point() else value
        assert torch.allclose(exported[key], expected) if value.is_floating_point() else torch.equal(exported[key], expected), key
    assert torch.equal(exported["decoder.weight"], exported["embed.weight"])


def test_zero_stage_0_export_and_stale_checkpoints_removed(toy, tmp_path):
    state, _ = run_toy(toy, tmp_path, total=3, zero_stage=0, checkpoint_every=0)
    exported = load_file(tmp_path / "model.safetensors")
    assert all(torch.equal(exported[k], v.float() if v.is_floating_point() else v) for k, v in state.items())
    # a different run (other total => other fingerprint) must not resume these checkpoints
    _, result = run_toy(toy, tmp_path, total=2, zero_stage=0, checkpoint_every=0)
    assert result.start_step == 0
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step_*")) == ["step_0000002"]


def test_a_constant_speed_loop_logs_a_constant_rate(toy, tmp_path, monkeypatch):
    """Each micro-batch takes a fixed time per input unit, so tokens/s must be the same at every
    log line; validation and checkpoints (also slow here) are timed apart, not in the rate.

    The loop reads a virtual clock that only the model's forward (units x seconds_per_unit) and a
    checkpoint save (a fixed cost) advance: the rate is then exact on any machine, however loaded
    (a wall-clock version of this test failed under load, with compute time beside the sleeps)."""
    import types

    from pipeline.training import loop

    seconds_per_unit, save_s = 1e-3, 0.25
    clock = [0.0]
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    class ConstantSpeed(toy.Model):
        def forward(self, batch, task):
            clock[0] += float(batch["txt_mask"].sum()) * seconds_per_unit
            return super().forward(batch, task)

    real_save = Checkpointer.save

    def slow_save(self, *args, **kwargs):
        clock[0] += save_s
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(Checkpointer, "save", slow_save)
    _, result = run_toy(toy, tmp_path, total=24, checkpoint_every=6, model_cls=ConstantSpeed)
    rates = [float(v) for _, v in read_tsv(tmp_path / "live/plots/metrics/train/tokens_per_s.tsv")]
    # the old loop's rate fell like 1/step, to a 24th of the first value by step 24
    assert len(rates) == 24 and rates == pytest.approx([1 / seconds_per_unit] * 24, rel=1e-4), rates
    timings = result.timings_s
    assert timings["checkpoint"] == pytest.approx(4 * save_s)  # steps 6, 12, 18, 24
    assert timings["validation"] > 0  # validation's forwards, timed apart from training
    assert timings["train"] >= 24 * 2 * 4 * seconds_per_unit  # at least 2 micro-batches of >= 4 tokens a step


def test_one_rank_shortcut_trains_the_same_bits_as_the_all_reduce(toy, tmp_path, monkeypatch):
    """ZeRO-0 on one rank skips DeepSpeed's gradient all-reduce (an identity that costs three passes
    over every gradient) and zero-fills the gradients of the heads a step did not use, as the
    all-reduce did: the weights after training are the same bits as with the all-reduce."""
    shortcut, _ = run_toy(toy, tmp_path / "shortcut", total=6, zero_stage=0)

    plain_initialize = initialize

    def with_all_reduce(model, settings):
        engine = plain_initialize(model, settings)
        assert engine.enable_backward_allreduce is False  # the shortcut is on for one rank, ZeRO-0
        engine.enable_backward_allreduce = True
        return engine

    monkeypatch.setattr(sys.modules[__name__], "initialize", with_all_reduce)
    reduced, _ = run_toy(toy, tmp_path / "all_reduce", total=6, zero_stage=0)
    assert shortcut.keys() == reduced.keys()
    for name, value in shortcut.items():
        assert torch.equal(value, reduced[name]), name


def test_first_phase_dropout_holds_for_the_phase_and_survives_a_resume(toy, tmp_path):
    """``first_phase_dropout`` sets the model's dropout for steps 1..first_phase_steps and puts the
    model's own back from the next step; it follows the step number, so a run killed inside the
    phase resumes to the same weights as an uninterrupted one."""
    seen: list[float] = []

    class Recording(toy.Model):
        def forward(self, batch, task):
            if self.training:
                seen.append(self.drop.p)
            return super().forward(batch, task)

    full, _ = run_toy(toy, tmp_path / "full", total=6, model_cls=Recording, first_phase=(3, 0.0))
    # grad_accum 2: two training forwards a step
    assert seen == [0.0] * 6 + [0.2] * 6, seen
    with pytest.raises(Crash):
        run_toy(toy, tmp_path / "crashed", total=6, checkpoint_every=1, crash_after=4, first_phase=(3, 0.0))
    resumed, result = run_toy(toy, tmp_path / "crashed", total=6, checkpoint_every=1, first_phase=(3, 0.0))
    assert result.start_step == 2
    for key in full:
        assert torch.equal(full[key], resumed[key]), key
    plain, _ = run_toy(toy, tmp_path / "plain", total=6, first_phase=(3, None))
    assert any(not torch.equal(full[k], plain[k]) for k in full)  # the phase's dropout changed the training
