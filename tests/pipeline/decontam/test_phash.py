"""pHash files and the pigeonhole near-duplicate search (checked against brute force)."""

from __future__ import annotations

import os

import imagehash
import numpy as np
import pytest
from PIL import Image

from pipeline.decontam.phash import PhashCache, near_duplicate_pairs, phash_file


def _brute_force(query: np.ndarray, ref: np.ndarray, k: int) -> set[tuple[int, int]]:
    return {(i, j) for i, q in enumerate(query.tolist()) for j, r in enumerate(ref.tolist())
            if (q ^ r).bit_count() <= k}


def _flip_bits(h: int, n: int, rng: np.random.Generator) -> int:
    for bit in rng.choice(64, size=n, replace=False).tolist():
        h ^= 1 << bit
    return h


@pytest.mark.parametrize("k", [0, 1, 4, 7, 12])
def test_near_duplicate_pairs_equal_brute_force(k):
    rng = np.random.default_rng(k)
    ref = rng.integers(0, 2**63, size=300, dtype=np.int64).astype(np.uint64) * np.uint64(2) + np.uint64(1)
    # queries: random ones, plus copies of refs with 0..k+2 bits flipped (inside and just outside k)
    planted = [_flip_bits(int(ref[i]), int(rng.integers(0, k + 3)), rng) for i in rng.integers(0, 300, size=200)]
    query = np.concatenate([rng.integers(0, 2**63, size=300, dtype=np.int64).astype(np.uint64),
                            np.array(planted, dtype=np.uint64), ref[:5]])
    qi, ri = near_duplicate_pairs(query, ref, k, chunk=97)
    got = set(zip(qi.tolist(), ri.tolist()))
    assert got == _brute_force(query, ref, k)
    assert len(got) >= 5  # the planted ones exist, so the test can fail
    assert list(zip(qi.tolist(), ri.tolist())) == sorted(got)


def test_near_duplicate_pairs_handles_empty_and_bad_input():
    empty = np.zeros(0, np.uint64)
    assert [a.tolist() for a in near_duplicate_pairs(empty, np.ones(3, np.uint64), 4)] == [[], []]
    with pytest.raises(ValueError, match="0..32"):
        near_duplicate_pairs(empty, empty, 40)


def test_phash_file_equals_imagehash_and_skips_unreadable(tmp_path):
    rng = np.random.default_rng(0)
    pixels = np.kron(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), np.ones((8, 8, 1), np.uint8))
    Image.fromarray(pixels).save(tmp_path / "a.png")
    expected = int(str(imagehash.phash(Image.open(tmp_path / "a.png"))), 16)
    assert phash_file(str(tmp_path / "a.png")) == expected
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "cut.png").write_bytes((tmp_path / "a.png").read_bytes()[:60])
    assert phash_file(str(tmp_path / "empty.jpg")) is None
    assert phash_file(str(tmp_path / "cut.png")) is None
    assert phash_file(str(tmp_path / "missing.png")) is None


def test_cache_reuses_hashes_and_notices_changed_files(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    paths = []
    for i in range(3):
        p = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    cache_file = tmp_path / "cache" / "phash.parquet"
    cache = PhashCache(cache_file)
    first = cache.hashes(paths + [str(tmp_path / "missing.png")])
    cache.save()
    assert first[:3] == [phash_file(p) for p in paths] and first[3] is None

    calls = []
    monkeypatch.setattr("pipeline.decontam.phash.phash_file", lambda p: calls.append(p) or 7)
    reloaded = PhashCache(cache_file)
    assert reloaded.hashes(paths) == first[:3] and calls == []  # all from the cache
    Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(paths[1])  # new size
    os.utime(paths[1], ns=(1, 1))
    assert reloaded.hashes(paths) == [first[0], 7, first[2]] and calls == [paths[1]]
