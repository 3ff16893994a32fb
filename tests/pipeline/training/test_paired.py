"""The paired cluster-bootstrap interval of a gain (pipeline.training.paired), checked against the
delta-method standard error of a ratio of group sums and against its coverage in simulation."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.training.paired import group_key, groups_for_half_width, item_scores, paired_gain, pooled_items


def two_starts(rng: np.random.Generator, sizes: list[int], *, p_scratch: float, gain: float,
               image_effect: float) -> tuple[dict, dict]:
    """Right/wrong scores of two starts on items in groups of ``sizes``; within a group the items share
    a random shift of both starts' success probability (``image_effect``), so they are correlated."""
    ids, groups, pre, scr = [], [], [], []
    for g, size in enumerate(sizes):
        shift = rng.normal(0.0, image_effect)
        p0 = float(np.clip(p_scratch + shift, 0.0, 1.0))
        p1 = float(np.clip(p_scratch + gain + shift, 0.0, 1.0))
        for k in range(size):
            ids.append(f"q{g}-{k}")
            groups.append(group_key([f"img/{g}"]))
            pre.append(float(rng.random() < p1))
            scr.append(float(rng.random() < p0))
    return item_scores(ids, groups, pre), item_scores(ids, groups, scr)


def delta_method_se(pre: dict, scr: dict) -> float:
    """Standard error (points) of sum(d) / sum(n) over resampled groups, linearised: the textbook
    cluster-robust formula sqrt(G / (G - 1) * sum((D_g - r N_g)^2)) / sum(N_g), times 100."""
    d = np.asarray(pre["scores"]) - np.asarray(scr["scores"])
    _, index = np.unique(pre["groups"], return_inverse=True)
    sums, sizes = np.bincount(index, weights=d), np.bincount(index).astype(float)
    ratio, groups = sums.sum() / sizes.sum(), len(sizes)
    return 100.0 * float(np.sqrt(((sums - ratio * sizes) ** 2).sum() * groups / (groups - 1)) / sizes.sum())


def test_the_interval_is_the_cluster_robust_standard_error_wide():
    rng = np.random.default_rng(1)
    pre, scr = two_starts(rng, [int(s) for s in rng.integers(1, 9, size=300)], p_scratch=0.55, gain=0.05,
                          image_effect=0.2)
    out = paired_gain(pre, scr)
    se = delta_method_se(pre, scr)
    assert out["se"] == pytest.approx(se, rel=0.06)
    assert out["high"] - out["low"] == pytest.approx(2 * 1.96 * se, rel=0.08)
    d = np.asarray(pre["scores"]) - np.asarray(scr["scores"])
    assert out["gain"] == pytest.approx(100.0 * d.mean(), abs=0.005)
    assert out["items"] == len(d) and out["groups"] == 300 and out["level"] == 0.95


def test_items_of_one_image_move_together():
    """Six copies of every item in its own image's group are no more evidence than one; the same
    copies counted as independent items would narrow the interval by about sqrt(6)."""
    rng = np.random.default_rng(2)
    pre, scr = two_starts(rng, [1] * 200, p_scratch=0.6, gain=0.04, image_effect=0.0)

    def copies(scored: dict, *, own_group: bool) -> dict:
        ids = [f"{i}#{k}" for i in scored["ids"] for k in range(6)]
        groups = [f"{g}#{k}" if own_group else g for g in scored["groups"] for k in range(6)]
        return item_scores(ids, groups, [s for s in scored["scores"] for _ in range(6)])

    once = paired_gain(pre, scr)
    grouped = paired_gain(copies(pre, own_group=False), copies(scr, own_group=False))
    split = paired_gain(copies(pre, own_group=True), copies(scr, own_group=True))
    assert grouped["se"] == pytest.approx(once["se"], rel=0.05)
    assert split["se"] == pytest.approx(once["se"] / np.sqrt(6), rel=0.1)


def test_the_interval_covers_the_true_gain_about_95_times_in_100():
    rng = np.random.default_rng(3)
    true_gain, trials, covered = 0.06, 200, 0
    for _ in range(trials):
        pre, scr = two_starts(rng, [4] * 60, p_scratch=0.5, gain=true_gain, image_effect=0.15)
        out = paired_gain(pre, scr, resamples=1000, seed=int(rng.integers(1 << 31)))
        covered += out["low"] <= 100 * true_gain <= out["high"]
    assert 0.89 <= covered / trials <= 0.99


def test_the_same_scores_give_the_same_interval_in_any_item_order():
    rng = np.random.default_rng(4)
    pre, scr = two_starts(rng, [3] * 50, p_scratch=0.5, gain=0.1, image_effect=0.1)
    order = rng.permutation(len(scr["ids"]))
    shuffled = {k: [v[i] for i in order] for k, v in scr.items()}
    assert paired_gain(pre, scr) == paired_gain(pre, shuffled)
    assert paired_gain(pre, scr, seed=1) != paired_gain(pre, scr)  # the seed is what fixes the draw


def test_a_start_that_wins_every_item_has_a_point_interval():
    pre = item_scores(["a", "b", "c"], ["x", "x", "y"], [1.0, 1.0, 1.0])
    scr = item_scores(["a", "b", "c"], ["x", "x", "y"], [0.0, 0.0, 0.0])
    assert paired_gain(pre, scr) | {"se": 0.0} == {"gain": 100.0, "low": 100.0, "high": 100.0, "se": 0.0,
                                                  "level": 0.95, "items": 3, "groups": 2, "resamples": 10_000}


def test_bad_scores_are_refused_with_the_item_named():
    with pytest.raises(ValueError, match="item b has 1.5"):
        item_scores(["a", "b"], ["x", "y"], [0.0, 1.5])
    with pytest.raises(ValueError, match="2 ids, 1 groups"):
        item_scores(["a", "b"], ["x"], [0.0, 1.0])
    pre = item_scores(["a", "b"], ["x", "y"], [1.0, 0.0])
    with pytest.raises(ValueError, match="different items"):
        paired_gain(pre, item_scores(["a", "c"], ["x", "y"], [1.0, 0.0]))
    with pytest.raises(ValueError, match="item b is in group 'y' for one start, 'z'"):
        paired_gain(pre, item_scores(["a", "b"], ["x", "z"], [1.0, 0.0]))


def test_group_key_is_the_set_of_images():
    assert group_key(["nlvr2/b", "nlvr2/a"]) == group_key(["nlvr2/a", "nlvr2/b"]) == "nlvr2/a|nlvr2/b"


def test_pooled_splits_keep_equal_ids_apart():
    a = item_scores(["1", "2"], ["img/a", "img/a"], [1.0, 0.0])
    b = item_scores(["1"], ["img/b"], [0.5])
    assert pooled_items({"testA": a, "testB": b}) == {"ids": ["testA:1", "testA:2", "testB:1"],
                                                      "groups": ["img/a", "img/a", "img/b"],
                                                      "scores": [1.0, 0.0, 0.5]}


def test_a_split_sized_from_a_small_one_gets_the_half_width_asked_for():
    """The sizing rule: from one measured interval on 80 groups, the groups for half its half-width
    (about 4 x 80); a split of that size drawn from the same process has about that half-width."""
    rng = np.random.default_rng(5)
    setting = dict(p_scratch=0.55, gain=0.08, image_effect=0.2)
    small = paired_gain(*two_starts(rng, [5] * 80, **setting))
    target = (small["high"] - small["low"]) / 4
    need = groups_for_half_width(small, target)
    assert 4 * 80 <= need <= 4 * 80 + 1
    big = paired_gain(*two_starts(rng, [5] * need, **setting))
    assert (big["high"] - big["low"]) / 2 == pytest.approx(target, rel=0.2)
    assert groups_for_half_width(small, (small["high"] - small["low"]) / 2) == 80  # as wide as asked: no growth
    with pytest.raises(ValueError, match="target half-width"):
        groups_for_half_width(small, 0.0)
