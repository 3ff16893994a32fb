"""The prefix-key argsort equals Arrow's string sort on every kind of id column."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.decontam.arrow_sort import count_distinct, sort_indices, take_sorted


def _ids(kind: str, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    if kind == "sha1":
        return [f"cc:{rng.getrandbits(160):040x}" for _ in range(n)]
    if kind == "numbers":  # varying lengths after the prefix
        return [f"coco:{rng.randrange(10**rng.randrange(1, 9))}-{k}" for k in range(n)]
    if kind == "long_common":  # differ only after 8+ bytes: every key ties, falls back
        return [f"vg:region:000000{rng.randrange(10**6):06d}:{k}" for k in range(n)]
    if kind == "few_ties":  # mostly distinct prefixes, some equal in their first 8 bytes
        return [f"x{rng.randrange(10**6):06d}" + ("" if rng.random() < 0.9 else f"zz{k}") for k in range(n)]
    return ["".join(rng.choice("aé\u4e2d\U0001f600b0") for _ in range(rng.randrange(0, 12))) for _ in range(n)]


@pytest.mark.parametrize("kind", ["sha1", "numbers", "long_common", "few_ties", "unicode"])
@pytest.mark.parametrize("large", [False, True])
def test_sort_indices_equals_arrow(kind, large):
    ids = pa.array(_ids(kind, 5000, hash(kind) % 1000), pa.large_string() if large else pa.string())
    expected = pc.sort_indices(ids).to_numpy()
    np.testing.assert_array_equal(sort_indices(ids), expected)
    np.testing.assert_array_equal(sort_indices(ids.slice(100, 3000)), pc.sort_indices(ids.slice(100, 3000)).to_numpy())


@settings(deadline=None, max_examples=200)
@given(st.lists(st.text(max_size=12), max_size=40))
def test_sort_indices_property(values):
    ids = pa.array(values, pa.string())
    np.testing.assert_array_equal(sort_indices(ids), pc.sort_indices(ids).to_numpy())


@settings(deadline=None, max_examples=200)
@given(st.lists(st.one_of(st.text(max_size=12), st.sampled_from(["a", "a\x00", "ab", "x" * 20, "x" * 21])),
                max_size=40))
def test_count_distinct_property(values):
    ids = pa.array(values, pa.string())
    assert count_distinct(ids) == pc.count_distinct(ids).as_py()


@pytest.mark.parametrize("kind", ["sha1", "numbers", "long_common", "few_ties", "unicode"])
def test_count_distinct_equals_arrow(kind):
    values = _ids(kind, 3000, 7)
    values += values[::3]  # repeats, as image ids repeat over rows
    ids = pa.array(values, pa.string())
    assert count_distinct(ids) == pc.count_distinct(ids).as_py() == len(set(values))
    assert count_distinct(ids.slice(10, 2000)) == len(set(values[10:2010]))


def test_take_sorted_sorts_every_column_and_skips_sorted_input():
    ids = _ids("sha1", 2000, 1)
    table = pa.table({"example_id": ids, "n": list(range(2000)), "s": [i[::-1] for i in ids]})
    for workers in (1, 2):
        out = take_sorted(table, "example_id", workers=workers)
        assert out.schema == table.schema
        assert out.column("example_id").to_pylist() == sorted(ids)
        assert out.column("s").to_pylist() == [i[::-1] for i in sorted(ids)]
    already = take_sorted(table, "example_id")
    assert take_sorted(already, "example_id") is already
    dropped = set(ids[::3])
    kept = sorted(i for i in ids if i not in dropped)
    for source in (table, already):  # unsorted and sorted inputs, with a selection
        keep = pa.array([i not in dropped for i in source.column("example_id").to_pylist()])
        out = take_sorted(source, "example_id", keep=keep, workers=2)
        assert out.column("example_id").to_pylist() == kept
        assert out.column("s").to_pylist() == [i[::-1] for i in kept]
