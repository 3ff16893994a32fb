import pytest

from pipeline.training.metrics import MetricsLogger, RunningMeans, truncate_dvclive


def test_accuracies_are_weighted_by_their_counts():
    m = RunningMeans()
    m.add("train/mlm", 2.0, {"loss": 2.0, "mlm_acc": 1.0, "n_tokens": 3})
    m.add("train/mlm", 4.0, {"loss": 4.0, "mlm_acc": 0.0, "n_tokens": 1})
    out = m.reduce()
    assert out["train/mlm/loss"] == 3.0  # losses: mean over batches
    assert out["train/mlm/mlm_acc"] == 0.75  # 3 of 4 tokens right
    assert set(out) == {"train/mlm/loss", "train/mlm/mlm_acc"}  # counts are weights, not metrics
    restored = RunningMeans()
    restored.load_state_dict(m.state_dict())
    assert restored.reduce() == out


def test_subset_means_are_weighted_by_their_subset_and_skip_empty_ones():
    m = RunningMeans()
    nan = float("nan")
    # ot_pos is the mean OT distance of a batch's matched pairs: undefined when it has none
    m.add("val/itm", 0.7, {"itm_acc": 0.5, "ot_pos": nan, "ot_neg": 0.8, "n_pairs": 2, "n_pos": 0, "n_neg": 2})
    m.add("val/itm", 0.6, {"itm_acc": 1.0, "ot_pos": 0.2, "ot_neg": 0.5, "n_pairs": 4, "n_pos": 3, "n_neg": 1})
    m.add("val/itm", 0.5, {"itm_acc": 0.0, "ot_pos": 0.6, "ot_neg": nan, "n_pairs": 1, "n_pos": 1, "n_neg": 0})
    out = m.reduce()
    assert out["val/itm/ot_pos"] == pytest.approx((0.2 * 3 + 0.6) / 4)
    assert out["val/itm/ot_neg"] == pytest.approx((0.8 * 2 + 0.5) / 3)
    assert out["val/itm/itm_acc"] == pytest.approx((0.5 * 2 + 4) / 7)
    assert not any(k.endswith(("n_pos", "n_neg")) for k in out)


def test_dvclive_resume_drops_steps_after_the_checkpoint(tmp_path):
    logger = MetricsLogger(tmp_path, stage="test", enabled=True, resume_step=None, params={"a": 1})
    for step in (1, 2, 3, 4):
        logger.log(step, {"train/loss": 1.0 / step})
    logger.close()
    truncate_dvclive(tmp_path, 2)
    lines = (tmp_path / "plots/metrics/train/loss.tsv").read_text().splitlines()
    assert lines == ["step\tloss", "1\t1.0", "2\t0.5"]
    logger = MetricsLogger(tmp_path, stage="test", enabled=True, resume_step=2, params={"a": 1})
    logger.log(3, {"train/loss": 0.25})
    logger.close()
    lines = (tmp_path / "plots/metrics/train/loss.tsv").read_text().splitlines()
    assert lines == ["step\tloss", "1\t1.0", "2\t0.5", "3\t0.25"]


def test_resume_after_a_kill_mid_write(tmp_path):
    logger = MetricsLogger(tmp_path, stage="test", enabled=True, resume_step=None, params={})
    for step in (1, 2, 3):
        logger.log(step, {"train/loss": 1.0 / step, "val/mlm/mlm_acc": 0.1 * step})
    logger.close()
    loss = tmp_path / "plots/metrics/train/loss.tsv"
    loss.write_text(loss.read_text() + "4\t0.2")  # the kill cut this row short (no newline, not flushed)
    (tmp_path / "metrics.json").write_text('{"train": {"lo')  # and the summary mid-write
    logger = MetricsLogger(tmp_path, stage="test", enabled=True, resume_step=3, params={})
    assert logger.live.summary == {"train": {"loss": 1.0 / 3}, "val": {"mlm": {"mlm_acc": 0.1 * 3}}, "step": 3}
    logger.log(4, {"train/loss": 0.25})
    logger.close()
    assert loss.read_text().splitlines()[-2:] == [f"3\t{1.0 / 3}", "4\t0.25"]
