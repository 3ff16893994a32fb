"""TokenBucketSampler (coverage across ranks, token budget, determinism, exact resume, padding
efficiency) and the pretraining collate (shapes, padding, masks)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from pipeline.training.batching import TokenBucketSampler, collate_pretrain, greedy_token_batches, padding_efficiency


def lengths(n: int = 3000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Caption-like text lengths (with [CLS]/[SEP]) and detector-like region counts (10..100)."""
    rng = np.random.default_rng(seed)
    txt = np.clip(rng.poisson(12, n) + 2, 3, 62)
    img = np.clip(rng.normal(40, 20, n).round(), 10, 100).astype(int)
    return txt, img


def padded_size(batch, txt, img) -> int:
    return len(batch) * int(txt[batch].max() + img[batch].max())


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_ranks_together_cover_every_example_exactly_once(world_size):
    txt, img = lengths(1000)
    seen = collections.Counter()
    counts = []
    for rank in range(world_size):
        s = TokenBucketSampler(txt, img, batch_tokens=1500, bucket_size=256, seed=3, rank=rank,
                               world_size=world_size, uneven="uneven")
        s.set_epoch(2)
        batches = list(s)
        counts.append(len(batches))
        seen.update(i for b in batches for i in b)
    assert sorted(seen) == list(range(1000)) and set(seen.values()) == {1}
    assert max(counts) - min(counts) <= 1


def test_pad_and_drop_policies_give_equal_batch_counts_and_say_what_they_repeat_or_lose():
    txt, img = lengths(1000)
    n_global = len(TokenBucketSampler(txt, img, batch_tokens=1500, seed=3).global_batches(0))
    world = 4 if n_global % 4 else 3
    assert n_global % world  # the remainder is what the policies handle
    for policy in ("pad", "drop"):
        per_rank = [list(TokenBucketSampler(txt, img, batch_tokens=1500, seed=3, rank=r, world_size=world,
                                            uneven=policy)) for r in range(world)]
        assert len({len(b) for b in per_rank}) == 1
        seen = collections.Counter(i for batches in per_rank for b in batches for i in b)
        if policy == "pad":
            assert set(seen) == set(range(1000)) and max(seen.values()) == 2
            assert sum(len(b) for b in per_rank) == -(-n_global // world) * world
        else:
            assert set(seen.values()) == {1} and len(seen) < 1000
            assert sum(len(b) for b in per_rank) == n_global // world * world


def test_every_batch_respects_the_padded_token_budget():
    txt, img = lengths(2000)
    for budget in (300, 1000, 4096):
        s = TokenBucketSampler(txt, img, batch_tokens=budget, bucket_size=500, seed=1)
        batches = list(s)
        assert all(padded_size(b, txt, img) <= budget for b in batches)
        assert sorted(i for b in batches for i in b) == list(range(2000))
    capped = TokenBucketSampler(txt, img, batch_tokens=100_000, seed=1, max_batch_size=32)
    assert max(len(b) for b in capped) == 32
    with pytest.raises(ValueError, match="more than batch_tokens"):
        TokenBucketSampler(txt, img, batch_tokens=100)


def test_shuffle_is_deterministic_per_seed_and_epoch():
    txt, img = lengths(500)
    a = TokenBucketSampler(txt, img, batch_tokens=1200, seed=5)
    b = TokenBucketSampler(txt, img, batch_tokens=1200, seed=5)
    assert list(a) == list(b)
    a.set_epoch(1)
    assert list(a) != list(b)
    b.set_epoch(1)
    assert list(a) == list(b)
    assert list(TokenBucketSampler(txt, img, batch_tokens=1200, seed=6)) != list(TokenBucketSampler(
        txt, img, batch_tokens=1200, seed=5))


def test_resume_mid_epoch_continues_with_exactly_the_remaining_batches():
    txt, img = lengths(800)
    full = TokenBucketSampler(txt, img, batch_tokens=1500, seed=9, rank=1, world_size=2)
    full.set_epoch(3)
    expected = list(full)
    first = TokenBucketSampler(txt, img, batch_tokens=1500, seed=9, rank=1, world_size=2)
    first.set_epoch(3)
    it = iter(first)
    head = [next(it) for _ in range(7)]
    state = first.state_dict()
    assert state["epoch"] == 3 and state["position"] == 7
    resumed = TokenBucketSampler(txt, img, batch_tokens=1500, seed=9, rank=1, world_size=2)
    resumed.load_state_dict(state)
    resumed.set_epoch(3)  # a training loop calling set_epoch for the resumed epoch keeps the position
    assert len(resumed) == len(expected) - 7
    assert head + list(resumed) == expected
    assert list(resumed) == expected  # the next pass over the epoch is whole again
    # a trainer that knows how many batches it consumed (DataLoader prefetch) passes that count
    assert first.state_dict(batches_consumed=5)["position"] == 5
    resumed.load_state_dict(first.state_dict(batches_consumed=5))
    assert list(resumed) == expected[5:]
    with pytest.raises(ValueError, match="different lengths or batching settings"):
        TokenBucketSampler(txt, img, batch_tokens=1600, seed=9, rank=1, world_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="rank 1"):
        TokenBucketSampler(txt, img, batch_tokens=1500, seed=9, rank=0, world_size=2).load_state_dict(state)


def test_bucketed_batches_are_over_95_percent_real_tokens_and_beat_random_batches():
    txt, img = lengths(20_000)  # text and regions are padded separately: both must be homogeneous
    s = TokenBucketSampler(txt, img, batch_tokens=4096, seed=0)
    ours = padding_efficiency(list(s), txt, img)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(txt))
    mean_size = int(np.mean([len(b) for b in s]))
    random_batches = [order[i:i + mean_size] for i in range(0, len(order), mean_size)]
    baseline = padding_efficiency(random_batches, txt, img)
    assert ours >= 0.95 and baseline < 0.75


def test_greedy_batches_match_a_brute_force_budget_check():
    txt = np.array([3, 5, 4, 10, 2])
    img = np.array([10, 10, 11, 12, 30])
    order = np.array([0, 2, 1, 3, 4])
    # padded sizes: [0,2,1] -> 3*(5+11)=48 <= 50; adding 3 -> 4*(10+12)=88 > 50
    assert greedy_token_batches(txt, img, order, batch_tokens=50) == [[0, 2, 1], [3], [4]]


def example(lt: int, n: int, task: str, *, d: int = 8, c: int = 5, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ex = {"task": task, "input_ids": torch.arange(1, lt + 1), "img_feat": rng.random((n, d)).astype(np.float16),
          "img_pos": rng.random((n, 7)).astype(np.float16)}
    if task == "mlm":
        ex["txt_labels"] = torch.full((lt,), -100).index_fill_(0, torch.tensor([1]), 7)
    if task == "mrfr":
        ex["img_masked"] = torch.zeros(n, dtype=torch.bool).index_fill_(0, torch.tensor([0]), True)
        ex["img_soft_labels"] = rng.random((n, c)).astype(np.float16)
    if task == "itm":
        ex["itm_target"] = seed % 2
    return ex


def test_collate_pads_to_the_batch_maximum_and_builds_masks():
    exs = [example(5, 3, "mrfr", seed=0), example(9, 6, "mrfr", seed=1), example(4, 2, "mrfr", seed=2)]
    batch = collate_pretrain(exs)
    assert batch["task"] == "mrfr"
    assert batch["input_ids"].shape == (3, 9) and batch["input_ids"].dtype == torch.long
    assert batch["img_feat"].shape == (3, 6, 8) and batch["img_feat"].dtype == torch.float32
    assert batch["img_pos"].shape == (3, 6, 7) and batch["img_soft_labels"].shape == (3, 6, 5)
    assert batch["txt_mask"].sum(1).tolist() == [5, 9, 4] and batch["img_mask"].sum(1).tolist() == [3, 6, 2]
    assert batch["input_ids"][2, 4:].eq(0).all() and batch["img_feat"][0, 3:].eq(0).all()
    np.testing.assert_array_equal(batch["img_feat"][1, :6].numpy(), exs[1]["img_feat"].astype(np.float32))
    assert batch["img_masked"].tolist()[0] == [True, False, False, False, False, False]
    assert torch.equal(batch["img_feat_target"], batch["img_feat"])
    assert batch["img_feat_target"].data_ptr() != batch["img_feat"].data_ptr()
    mlm = collate_pretrain([example(3, 2, "mlm"), example(6, 4, "mlm")])
    assert mlm["txt_labels"].tolist()[0] == [-100, 7, -100, -100, -100, -100] and "img_masked" not in mlm
    itm = collate_pretrain([example(3, 2, "itm", seed=1), example(6, 4, "itm", seed=2)])
    assert itm["itm_targets"].tolist() == [1, 0] and "txt_labels" not in itm
    with pytest.raises(ValueError, match="one pretraining task"):
        collate_pretrain([example(3, 2, "mlm"), example(3, 2, "itm")])
