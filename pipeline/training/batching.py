"""Token-bounded batching (docs/design.md §10) and the collate that packs text and regions.

:class:`TokenBucketSampler` is a batch sampler: each epoch it shuffles all examples with
``(seed, epoch)``, cuts the order into buckets of ``bucket_size``, orders each bucket so that neighbours have
similar region counts and text lengths (:meth:`TokenBucketSampler.length_order`) and greedily
fills batches while the *padded* batch, B x (max text +
max regions), stays within ``batch_tokens``. Batch order is shuffled again, then dealt to ranks
round-robin, so every rank sees a disjoint share and all ranks together see every example once
per epoch (see ``uneven`` for what happens to the remainder). It resumes mid-epoch exactly from
``state_dict()``.

:func:`collate_pretrain` pads text to the longest text of the batch and regions to the largest
region count of the batch (never to a global maximum) and returns the batch keys of
docs/design.md §10.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any, Iterator, Literal, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

UnevenPolicy = Literal["pad", "drop", "uneven"]


def greedy_token_batches(txt_lens: np.ndarray, img_lens: np.ndarray, order: np.ndarray, *, batch_tokens: int,
                         max_batch_size: int | None = None) -> list[list[int]]:
    """Cut ``order`` (already sorted) into batches whose padded size B*(max txt + max img) <= budget."""
    batches: list[list[int]] = []
    cur: list[int] = []
    max_t = max_i = 0
    for idx in order.tolist():
        t, i = int(txt_lens[idx]), int(img_lens[idx])
        new_t, new_i = max(max_t, t), max(max_i, i)
        full = max_batch_size is not None and len(cur) >= max_batch_size
        if cur and ((len(cur) + 1) * (new_t + new_i) > batch_tokens or full):
            batches.append(cur)
            cur, new_t, new_i = [], t, i
        cur.append(idx)
        max_t, max_i = new_t, new_i
    if cur:
        batches.append(cur)
    return batches


class TokenBucketSampler(Sampler[list[int]]):
    """Batches of example indices bounded by padded tokens (text + regions), per epoch and rank.

    Args:
        txt_lens: int [N], text tokens per example ([CLS] and [SEP] included).
        img_lens: int [N], regions per example.
        batch_tokens: budget for B x (max text len + max regions) of one batch.
        bucket_size: examples sorted together; larger = less padding, less randomness.
        seed, rank, world_size: the shuffle depends on (seed, epoch); rank takes batches
            rank, rank + world_size, ...
        uneven: the last ``n_batches % world_size`` batches: ``"pad"`` repeats the first batches
            of the epoch so all ranks get the same count (a few examples twice), ``"drop"`` drops
            them (a few examples not at all), ``"uneven"`` keeps exactly-once coverage and lets
            ranks differ by one batch.
        max_batch_size: optional cap on examples per batch.
        shuffle: False: no random permutation (evaluation); buckets are still length-sorted.
    """

    def __init__(self, txt_lens: Sequence[int], img_lens: Sequence[int], *, batch_tokens: int,
                 bucket_size: int = 65536, seed: int = 0, rank: int = 0, world_size: int = 1,
                 uneven: UnevenPolicy = "pad", max_batch_size: int | None = None, shuffle: bool = True) -> None:
        self.txt_lens = np.asarray(txt_lens, dtype=np.int64)
        self.img_lens = np.asarray(img_lens, dtype=np.int64)
        if self.txt_lens.shape != self.img_lens.shape or self.txt_lens.ndim != 1:
            raise ValueError(f"txt_lens {self.txt_lens.shape} and img_lens {self.img_lens.shape} must be equal 1-D")
        total = self.txt_lens + self.img_lens
        if len(total) and total.max() > batch_tokens:
            worst = int(total.argmax())
            raise ValueError(f"example {worst} has {total[worst]} tokens (text {self.txt_lens[worst]} + regions "
                             f"{self.img_lens[worst]}), more than batch_tokens={batch_tokens}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if uneven not in ("pad", "drop", "uneven"):
            raise ValueError(f"uneven must be pad, drop or uneven, got {uneven!r}")
        self.batch_tokens, self.bucket_size, self.seed = batch_tokens, bucket_size, seed
        self.rank, self.world_size, self.uneven = rank, world_size, uneven
        self.max_batch_size, self.shuffle = max_batch_size, shuffle
        self.epoch = 0
        self._start = 0  # batches of this epoch to skip on the next iteration (resume)
        self._position = 0  # batches of this epoch handed out so far
        self._cache: tuple[int, list[list[int]]] | None = None

    def fingerprint(self) -> str:
        """What a saved position is only valid for: the lengths and every batching setting."""
        h = hashlib.sha256()
        h.update(self.txt_lens.tobytes())
        h.update(self.img_lens.tobytes())
        h.update(repr((self.batch_tokens, self.bucket_size, self.seed, self.world_size, self.uneven,
                       self.max_batch_size, self.shuffle)).encode())
        return h.hexdigest()

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's shuffle; a new epoch starts from its first batch."""
        if epoch != self.epoch:
            self.epoch, self._start, self._position = epoch, 0, 0

    def global_batches(self, epoch: int) -> list[list[int]]:
        """All ranks' batches of ``epoch`` in order, before dealing them out (same on every rank)."""
        rng = np.random.default_rng([self.seed, epoch])
        n = len(self.txt_lens)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        batches: list[list[int]] = []
        for start in range(0, n, self.bucket_size):
            bucket = self.length_order(order[start:start + self.bucket_size])
            batches.extend(greedy_token_batches(self.txt_lens, self.img_lens, bucket, batch_tokens=self.batch_tokens,
                                                max_batch_size=self.max_batch_size))
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def length_order(self, bucket: np.ndarray) -> np.ndarray:
        """Order a bucket so that neighbours have similar text AND region counts.

        Text and regions are padded separately, so a batch costs B x (max text + max regions):
        sorting by one key leaves the other spread. We sort by regions, cut the bucket into
        strips of ``m`` batches, and sort each strip by text, alternating direction so the strip
        boundaries stay smooth. m ~ sqrt(batches per bucket / 4) balances the two spreads.
        """
        txt, img = self.txt_lens[bucket], self.img_lens[bucket]
        bucket = bucket[np.lexsort((txt, img))]
        per_batch = max(1, self.batch_tokens // max(1, int(np.mean(txt + img))))
        if self.max_batch_size is not None:
            per_batch = min(per_batch, self.max_batch_size)
        m = max(1, round(np.sqrt(len(bucket) / per_batch / 4)))
        strips = []
        for k, s in enumerate(range(0, len(bucket), m * per_batch)):
            strip = bucket[s:s + m * per_batch]
            strip = strip[np.lexsort((self.img_lens[strip], self.txt_lens[strip]))]
            strips.append(strip if k % 2 == 0 else strip[::-1])
        return np.concatenate(strips) if strips else bucket

    def rank_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch`` after the ``uneven`` policy."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        batches = self.global_batches(epoch)
        w = self.world_size
        if self.uneven == "pad" and len(batches) % w:
            batches = batches + batches[: w - len(batches) % w]
        elif self.uneven == "drop":
            batches = batches[: len(batches) - len(batches) % w]
        mine = batches[self.rank::w]
        self._cache = (epoch, mine)
        return mine

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.rank_batches(self.epoch)
        start, self._start = self._start, 0
        for k in range(start, len(batches)):
            self._position = k + 1
            yield batches[k]

    def __len__(self) -> int:
        return len(self.rank_batches(self.epoch)) - self._start

    def state_dict(self, batches_consumed: int | None = None) -> dict[str, Any]:
        """The position to resume from.

        ``batches_consumed`` = batches of the current epoch the trainer has actually used. Pass it
        when a DataLoader prefetches (the sampler itself only knows what it handed out, which runs
        ahead of training by the prefetch depth).
        """
        position = self._position if batches_consumed is None else int(batches_consumed)
        return {"epoch": self.epoch, "position": position, "rank": self.rank, "fingerprint": self.fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state``'s epoch and batch; raises if the lengths or settings differ."""
        if state["fingerprint"] != self.fingerprint():
            raise ValueError("sampler state was saved for different lengths or batching settings; cannot resume")
        if state["rank"] != self.rank:
            raise ValueError(f"sampler state belongs to rank {state['rank']}, this is rank {self.rank}")
        self.epoch = int(state["epoch"])
        self._start = self._position = int(state["position"])


def padding_efficiency(batches: Sequence[Sequence[int]], txt_lens: np.ndarray, img_lens: np.ndarray) -> float:
    """Real tokens / padded tokens over ``batches`` (1.0 = no padding)."""
    real = padded = 0
    for b in batches:
        t, i = txt_lens[list(b)], img_lens[list(b)]
        real += int(t.sum() + i.sum())
        padded += len(b) * int(t.max() + i.max())
    return real / max(padded, 1)


# --------------------------------------------------------------------------------------------
# collate


def _pad_text(examples: Sequence[dict[str, Any]], key: str, fill: int) -> torch.Tensor:
    seqs = [ex[key] for ex in examples]
    out = torch.full((len(seqs), max(len(s) for s in seqs)), fill, dtype=torch.long)
    for b, s in enumerate(seqs):
        out[b, : len(s)] = torch.as_tensor(s)
    return out


def _pad_regions(arrays: Sequence[np.ndarray], width: int, li: int) -> torch.Tensor:
    """[n_b, width] arrays (any float dtype) -> f32 [B, li, width], zero padded."""
    out = torch.zeros((len(arrays), li, width), dtype=torch.float32)
    with warnings.catch_warnings():
        # the arrays are read-only views over LMDB values; we only read them, so wrapping is safe
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for b, a in enumerate(arrays):
            out[b, : len(a)].copy_(torch.from_numpy(a))  # torch's f16 -> f32 copy is vectorized
    return out


def collate_pretrain(examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Pack examples of one pretraining task into the batch of docs/design.md §10.

    Each example: ``input_ids`` i64 [lt] ([CLS] text [SEP]), ``img_feat`` [n, D] and ``img_pos``
    [n, 7] (numpy, any float dtype), ``task``; optional ``txt_type_ids`` i64 [lt], ``txt_labels``
    i64 [lt], ``img_masked`` bool [n], ``img_soft_labels`` [n, C+1], ``itm_target`` int.
    Returns ``input_ids``/``txt_mask`` [B, Lt], ``img_feat`` f32 [B, Li, D], ``img_pos`` f32
    [B, Li, 7], ``img_mask`` [B, Li] and, when present in the examples, ``txt_type_ids`` (0 pad),
    ``txt_labels`` (-100 pad),
    ``img_masked`` (+ ``img_feat_target``, ``img_soft_labels``), ``itm_targets`` [B], ``task``.
    """
    tasks = {ex["task"] for ex in examples}
    if len(tasks) != 1:
        raise ValueError(f"a batch must hold one pretraining task, got {sorted(tasks)}")
    txt_lens = [len(ex["input_ids"]) for ex in examples]
    img_lens = [len(ex["img_feat"]) for ex in examples]
    li = max(img_lens)
    batch: dict[str, Any] = {"task": tasks.pop(), "input_ids": _pad_text(examples, "input_ids", 0)}
    batch["txt_mask"] = torch.arange(batch["input_ids"].shape[1])[None, :] < torch.tensor(txt_lens)[:, None]
    batch["img_feat"] = _pad_regions([ex["img_feat"] for ex in examples], examples[0]["img_feat"].shape[1], li)
    batch["img_pos"] = _pad_regions([ex["img_pos"] for ex in examples], 7, li)
    batch["img_mask"] = torch.arange(li)[None, :] < torch.tensor(img_lens)[:, None]
    if "txt_type_ids" in examples[0]:
        batch["txt_type_ids"] = _pad_text(examples, "txt_type_ids", 0)
    if "txt_labels" in examples[0]:
        batch["txt_labels"] = _pad_text(examples, "txt_labels", -100)
    if "img_masked" in examples[0]:
        masked = torch.zeros((len(examples), li), dtype=torch.bool)
        for b, ex in enumerate(examples):
            masked[b, : len(ex["img_masked"])] = torch.as_tensor(ex["img_masked"])
        batch["img_masked"] = masked
    if "img_soft_labels" in examples[0]:
        batch["img_feat_target"] = batch["img_feat"].clone()
        soft = [ex["img_soft_labels"] for ex in examples]
        batch["img_soft_labels"] = _pad_regions(soft, soft[0].shape[1], li)
    if "itm_target" in examples[0]:
        batch["itm_targets"] = torch.tensor([int(ex["itm_target"]) for ex in examples], dtype=torch.long)
    return batch
