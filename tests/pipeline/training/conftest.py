"""A small nn.Module with a UNITER-like ``forward(batch, task)`` and synthetic token-bucket batches.

They exercise pipeline/training on its own: the engine, streams, checkpoints and the loop do not
know about UNITER, so a two-task toy with dropout and tied weights covers what they must get
right (exact resume, consolidated export of tied parameters, per-task metrics).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("DS_ACCELERATOR", "cpu")

VOCAB = 40
DIM = 16


class ToyPretrainer(torch.nn.Module):
    """Two tasks: ``tok`` predicts each labelled token from its neighbours (tied decoder),
    ``reg`` regresses a per-example feature. Dropout makes the loss depend on the torch RNG."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.mix = torch.nn.Conv1d(DIM, DIM, kernel_size=3, padding=1)
        self.norm = torch.nn.LayerNorm(DIM)
        self.drop = torch.nn.Dropout(0.2)
        self.decoder = torch.nn.Linear(DIM, VOCAB)
        self.decoder.weight = self.embed.weight  # tied, like BERT's MLM decoder
        self.reg_head = torch.nn.Linear(DIM, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, batch: dict, task: str):
        h = self.embed(batch["input_ids"])
        h = self.norm(h + self.mix(h.transpose(1, 2)).transpose(1, 2))
        h = self.drop(h)
        if task == "tok":
            labels = batch["txt_labels"]
            logits = self.decoder(h)[labels != -100]
            target = labels[labels != -100]
            loss = F.cross_entropy(logits, target)
            acc = (logits.argmax(-1) == target).float().mean()
            return SimpleNamespace(loss=loss, metrics={"tok_acc": float(acc), "n_tokens": int(target.numel())})
        mask = batch["txt_mask"].unsqueeze(-1).float()
        pooled = (h * mask).sum(1) / mask.sum(1)
        loss = F.mse_loss(self.reg_head(pooled), batch["img_feat"])
        return SimpleNamespace(loss=loss, metrics={"n_pairs": int(pooled.shape[0])})


class ToyDataset(torch.utils.data.Dataset):
    """Deterministic sequences whose next token is a function of the previous one (learnable);
    masks are drawn per (seed, epoch, index), so an item does not depend on what came before."""

    def __init__(self, n: int, *, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.lengths = rng.integers(4, 13, size=n)
        self.starts = rng.integers(1, VOCAB, size=n)
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict:
        ids = [int(self.starts[i])]
        for _ in range(int(self.lengths[i]) - 1):
            ids.append(1 + (ids[-1] * 7 + 3) % (VOCAB - 1))
        ids = torch.tensor(ids)
        g = torch.Generator().manual_seed(self.seed * 7919 + self.epoch * 104729 + i)
        pick = torch.rand(len(ids), generator=g) < 0.3
        pick[int(torch.randint(0, len(ids), (1,), generator=g))] = True
        labels = torch.where(pick, ids, torch.full_like(ids, -100))
        masked = torch.where(pick, torch.zeros_like(ids), ids)
        feat = torch.tensor([ids.float().mean() / VOCAB, len(ids) / 12.0, float(ids[0]) / VOCAB, 0.5])
        return {"input_ids": masked, "txt_labels": labels, "img_feat": feat}


class ToyBucketSampler:
    """Shuffled (seed, epoch) batches of at most ``max_tokens`` padded tokens, sharded by rank."""

    def __init__(self, lengths, *, max_tokens: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
        self.lengths, self.max_tokens, self.seed = lengths, max_tokens, seed
        self.rank, self.world_size, self.epoch = rank, world_size, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.lengths))
        order = order[self.rank :: self.world_size]
        batch, longest = [], 0
        for i in order.tolist():
            longest_next = max(longest, int(self.lengths[i]))
            if batch and longest_next * (len(batch) + 1) > self.max_tokens:
                yield batch
                batch, longest_next = [], int(self.lengths[i])
            batch.append(i)
            longest = longest_next
        if batch:
            yield batch


def toy_collate(items: list[dict]) -> dict:
    L = max(len(it["input_ids"]) for it in items)
    ids = torch.zeros(len(items), L, dtype=torch.long)
    labels = torch.full((len(items), L), -100, dtype=torch.long)
    mask = torch.zeros(len(items), L, dtype=torch.bool)
    for b, it in enumerate(items):
        n = len(it["input_ids"])
        ids[b, :n], labels[b, :n], mask[b, :n] = it["input_ids"], it["txt_labels"], True
    return {"input_ids": ids, "txt_labels": labels, "txt_mask": mask,
            "img_feat": torch.stack([it["img_feat"] for it in items])}


@pytest.fixture
def toy():
    return SimpleNamespace(Model=ToyPretrainer, Dataset=ToyDataset, Sampler=ToyBucketSampler, collate=toy_collate)
