"""How far the gain of one start over the other can be trusted: a paired cluster-bootstrap interval
(and, over fine-tuning seeds, the spread of the scores: :func:`spread`).

Both starts of a task are scored on the same test items, so the gain is a paired difference. Items
are not independent: the questions of one image, the statements of one NLVR2 pair and the
expressions of one RefCOCO+ image share their regions, and a model that misreads an image misses
several of them at once. The interval therefore resamples *groups* (the images an item is about,
:func:`group_key`) with replacement, keeps each group's items together, and recomputes
``100 * sum(pretrained - scratch) / items`` on every resample; the percentile interval of those
gains is reported. Resampling items instead would treat 6 statements of one pair as 6 independent
draws and make the interval too narrow.

The resampling is seeded: the same scores give the same interval on every machine.

Item scores travel as JSON, ``{"ids": [str], "groups": [str], "scores": [float in [0, 1]]}`` per
``"split/metric"`` key; ``100 * mean(scores)`` is the metric in the results table (VQA: the official
per-question accuracy; retrieval: whether the query's top-1 is right; the rest: right or wrong).
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

ITEMS_FILE = "item_scores.json"  # what stage finetune writes beside a task's model: both starts' item scores
LEVEL = 0.95  # two-sided coverage of the interval
RESAMPLES = 10_000  # enough that the 2.5% tails move by < 0.1 point between seeds on the demo's splits
SEED = 0
_DRAWS_AT_ONCE = 2_000_000  # group indices drawn per block of resamples: bounds memory (16 MB)


def group_key(image_ids: Iterable[str]) -> str:
    """The resampling group of an item: the images it is about (an NLVR2 pair is one group)."""
    return "|".join(sorted(image_ids))


def item_scores(ids: Sequence[str], groups: Sequence[str], scores: Sequence[float]) -> dict[str, list]:
    """The JSON form of one split's per-item scores; lengths must agree and scores lie in [0, 1]."""
    if not len(ids) == len(groups) == len(scores):
        raise ValueError(f"item scores: {len(ids)} ids, {len(groups)} groups, {len(scores)} scores")
    bad = [(i, s) for i, s in zip(ids, scores) if not 0.0 <= float(s) <= 1.0]
    if bad:
        raise ValueError(f"item scores must lie in [0, 1]; item {bad[0][0]} has {bad[0][1]}")
    return {"ids": [str(i) for i in ids], "groups": [str(g) for g in groups], "scores": [float(s) for s in scores]}


def pooled_items(parts: Mapping[str, Mapping[str, list]]) -> dict[str, list]:
    """Several splits' :func:`item_scores` as one (RefCOCO+ testA+testB); an item becomes
    ``"<split>:<id>"``, so equal ids of two splits stay two items."""
    return {"ids": [f"{split}:{i}" for split, part in parts.items() for i in part["ids"]],
            "groups": [g for part in parts.values() for g in part["groups"]],
            "scores": [v for part in parts.values() for v in part["scores"]]}


def paired_gain(pretrained: Mapping[str, list], scratch: Mapping[str, list], *, level: float = LEVEL,
                resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, Any]:
    """The gain in points of ``pretrained`` over ``scratch`` (two :func:`item_scores` of the same items)
    and its paired cluster-bootstrap interval.

    Returns ``{"gain", "low", "high", "se", "level", "items", "groups", "resamples"}`` (points,
    rounded to 2 decimals; ``se`` is the standard deviation of the resampled gains).
    """
    diff, groups = _paired_differences(pretrained, scratch)
    codes, group_index = np.unique(np.asarray(groups), return_inverse=True)
    n_groups = len(codes)
    diff_sums = np.bincount(group_index, weights=diff, minlength=n_groups)
    sizes = np.bincount(group_index, minlength=n_groups).astype(np.float64)
    rng = np.random.default_rng(seed)
    block = max(1, _DRAWS_AT_ONCE // n_groups)
    gains = []
    for start in range(0, resamples, block):
        drawn = rng.integers(0, n_groups, size=(min(block, resamples - start), n_groups))  # groups, with replacement
        gains.append(100.0 * diff_sums[drawn].sum(axis=1) / sizes[drawn].sum(axis=1))
    boot = np.concatenate(gains)
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(boot, [tail, 100.0 - tail])
    return {"gain": round(100.0 * float(diff.mean()), 2), "low": round(float(low), 2), "high": round(float(high), 2),
            "se": round(float(boot.std()), 2), "level": level, "items": int(len(diff)), "groups": int(n_groups),
            "resamples": int(resamples)}


def groups_for_half_width(interval: Mapping[str, Any], target: float) -> int:
    """The groups a split needs for a gain's interval of half-width ``target`` points, from one
    measured :func:`paired_gain` record of the same task: a half-width shrinks as 1/sqrt(groups), so
    ``ceil(groups * (w / target) ** 2)`` with ``w`` half the measured interval's width. The protocol
    sizes test splits with it from *dev* records (docs/design.md §12)."""
    if not target > 0:
        raise ValueError(f"target half-width must be > 0 points, got {target}")
    half_width = (interval["high"] - interval["low"]) / 2
    return int(np.ceil(interval["groups"] * (half_width / target) ** 2 - 1e-9))


def _paired_differences(pretrained: Mapping[str, list], scratch: Mapping[str, list]) -> tuple[np.ndarray, list[str]]:
    """Per-item ``pretrained - scratch`` in the order of ``pretrained``'s ids, and each item's group."""
    other = dict(zip(scratch["ids"], zip(scratch["groups"], scratch["scores"])))
    if set(other) != set(pretrained["ids"]) or len(other) != len(pretrained["ids"]):
        missing = sorted(set(pretrained["ids"]) ^ set(other))[:3]
        raise ValueError(f"paired gain: the two starts were scored on different items (e.g. {missing})")
    if not other:
        raise ValueError("paired gain: no items")
    diff, groups = [], []
    for item, group, score in zip(pretrained["ids"], pretrained["groups"], pretrained["scores"]):
        other_group, other_score = other[item]
        if other_group != group:
            raise ValueError(f"paired gain: item {item} is in group {group!r} for one start, {other_group!r} for the other")
        diff.append(float(score) - float(other_score))
        groups.append(group)
    return np.asarray(diff, dtype=np.float64), groups


# the per-start scores and their gain, over fine-tuning seeds (``python -m pipeline seeds``, ``report spread``)
COLUMNS = ("pretrained", "scratch", "gain")


def spread(values: list[float]) -> dict[str, float | int]:
    """``{n, mean, sd, min, max}`` of ``values`` (sd: sample standard deviation, 0 for one value)."""
    return {"n": len(values), "mean": round(statistics.fmean(values), 4),
            "sd": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def spread_cell(s: Mapping[str, Any] | None, digits: int = 1) -> str:
    """A :func:`spread` as ``mean ± sd (min..max)`` with ``digits`` decimals; ``–`` for none."""
    if not s:
        return "–"
    return f"{s['mean']:.{digits}f} ± {s['sd']:.{digits}f} ({s['min']:.{digits}f}..{s['max']:.{digits}f})"
