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


def test_dvclive_resume_drops_steps_after_the_checkpoint(tmp_path):
    logger = MetricsLogger(tmp_path, enabled=True, resume_step=None, params={"a": 1})
    for step in (1, 2, 3, 4):
        logger.log(step, {"train/loss": 1.0 / step})
    logger.close()
    truncate_dvclive(tmp_path, 2)
    lines = (tmp_path / "plots/metrics/train/loss.tsv").read_text().splitlines()
    assert lines == ["step\tloss", "1\t1.0", "2\t0.5"]
    logger = MetricsLogger(tmp_path, enabled=True, resume_step=2, params={"a": 1})
    logger.log(3, {"train/loss": 0.25})
    logger.close()
    lines = (tmp_path / "plots/metrics/train/loss.tsv").read_text().splitlines()
    assert lines == ["step\tloss", "1\t1.0", "2\t0.5", "3\t0.25"]
