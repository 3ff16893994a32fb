"""Streamed all-pairs retrieval evaluation: equal to a dense reference, bounded blocks, bounded memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.finetune.tasks.retrieval_eval import chance_recall, recall_at_k, streaming_topk

ROOT = Path(__file__).resolve().parents[4]


def dense_topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Reference: full sort of each row, ties to the lower index (lexsort on (index, -score))."""
    idx = np.arange(scores.shape[1])
    return np.stack([np.lexsort((idx, -row))[:k] for row in scores])


@pytest.mark.parametrize("blocks", [(1, 1), (3, 2), (7, 5), (100, 100)])
def test_streamed_topk_equals_the_dense_ranking(blocks):
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, size=(23, 11)).astype(np.float32)  # few values: many ties
    calls = []

    def score_block(t: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        calls.append(len(t) * len(i))
        return torch.from_numpy(scores[t.numpy()][:, i.numpy()])

    text_block, image_block = blocks
    t_top, i_top, largest = streaming_topk(score_block, 23, 11, text_block=text_block, image_block=image_block, k=10)
    np.testing.assert_array_equal(t_top.numpy(), dense_topk(scores, 10))
    np.testing.assert_array_equal(i_top.numpy(), dense_topk(scores.T, 10))
    assert largest == max(calls) <= text_block * image_block
    assert sum(calls) == 23 * 11  # every pair scored exactly once


def test_recall_at_k_by_hand():
    top = torch.tensor([[2, 0, 1], [0, 1, 2], [1, 2, 0], [2, 1, 0]])
    relevant = [{0}, {0}, {0}, {3}]
    # query 0: relevant at rank 2; query 1 at rank 1; query 2 at rank 3; query 3 never
    assert recall_at_k(top, relevant, ks=(1, 2, 3)) == {"r1": 25.0, "r2": 50.0, "r3": 75.0}
    assert recall_at_k(torch.tensor([[1, 0]]), [{0, 1}], ks=(1,)) == {"r1": 100.0}


def test_chance_recall_by_hand():
    assert chance_recall(4, [1], ks=(1, 5)) == {"r1": 25.0, "r5": 100.0}
    # two relevant of four, top 2: 1 - C(2,2)/C(4,2) = 5/6
    assert chance_recall(4, [2], ks=(1, 2)) == {"r1": 50.0, "r2": round(500 / 6, 4)}


_MEMORY_PROBE = """
import json, resource, sys, torch
from pipeline.finetune.tasks.retrieval_eval import streaming_topk
torch.manual_seed(0)
n = int(sys.argv[1])
t_emb, i_emb = torch.randn(n, 8), torch.randn(n, 8)
def score(t, i):
    return t_emb[t] @ i_emb[i].T
streaming_topk(score, 64, 64, text_block=16, image_block=16)  # warm up the allocator and sort kernels
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
_, _, largest = streaming_topk(score, n, n, text_block=1024, image_block=32)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_mib": (after - before) / 1024, "largest": largest}))
"""


def test_memory_stays_far_below_the_score_matrix():
    n = 6000  # the dense T x I float32 matrix alone would be 137 MiB (a single block of it: 1.4 GiB measured)
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, str(n)], capture_output=True, text=True, check=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["largest"] == 1024 * 32
    assert probe["growth_mib"] < 40, probe  # [T, image_block] columns, their int64 keys, the top-k state


def test_rank_keys_order_scores_then_lower_ids():
    from pipeline.finetune.tasks.retrieval_eval import key_ids, rank_keys

    scores = torch.tensor([[-2.5, 0.0, -0.0, 3.0, -1e-30, float("-inf"), 3.0, 1e-30]])
    ids = torch.arange(8)[None]
    order = key_ids(rank_keys(scores, ids).sort(dim=1, descending=True).values)[0].tolist()
    assert order == [3, 6, 7, 1, 2, 4, 0, 5]  # 3.0 (ids 3 < 6), 1e-30, +0 and -0 tie (1 < 2), -1e-30, -2.5, -inf
