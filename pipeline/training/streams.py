"""Resumable, endless batch streams: one per pretraining task.

A stream walks its batch sampler epoch after epoch. Its position is two integers, the epoch and
the number of batches consumed in it, and never the sampler's own iterator (DataLoader workers
prefetch ahead of what training consumed). Resuming regenerates the epoch's batch order, which
the sampler derives from its seed and the epoch alone, and skips the consumed batches as index
lists, without loading them.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

log = logging.getLogger(__name__)


class EpochBatchSampler(Protocol):
    """What a stream needs from a batch sampler: a deterministic batch order per epoch."""

    def set_epoch(self, epoch: int) -> None: ...

    def __iter__(self) -> Iterator[Sequence[int]]: ...


class _Skip:
    """The epoch's batches from the ``skip``-th on (DataLoader's ``batch_sampler``)."""

    def __init__(self, sampler: EpochBatchSampler, skip: int) -> None:
        self.sampler, self.skip = sampler, skip

    def __iter__(self) -> Iterator[Sequence[int]]:
        return itertools.islice(iter(self.sampler), self.skip, None)


class BatchStream:
    """Endless batches of one dataset, with a position that can be saved and restored exactly.

    Args:
        dataset: map-style dataset; ``dataset[i]`` must be a pure function of ``i`` (and of the
            epoch the dataset was told through ``set_epoch``, if it has one): random masking must
            come from generators seeded per example, not from state advanced by earlier items.
        sampler: batch sampler with ``set_epoch`` (e.g. TokenBucketSampler).
        collate: list of examples -> batch dict.
        seed: seeds the DataLoader's own generator, so creating an iterator never draws from the
            global torch RNG (that would shift dropout after a resume).
    """

    def __init__(self, dataset: Dataset, sampler: EpochBatchSampler, collate: Callable[[list[Any]], dict[str, Any]],
                 *, seed: int, num_workers: int = 0, name: str = "") -> None:
        self.dataset, self.sampler, self.collate = dataset, sampler, collate
        self.seed, self.num_workers, self.name = seed, num_workers, name
        self.epoch = 0
        self.consumed = 0  # batches of ``self.epoch`` already handed out
        self._it: Iterator[dict[str, Any]] | None = None

    def _open(self) -> Iterator[dict[str, Any]]:
        self.sampler.set_epoch(self.epoch)
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.epoch)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        loader = DataLoader(self.dataset, batch_sampler=_Skip(self.sampler, self.consumed), collate_fn=self.collate,
                            num_workers=self.num_workers, generator=generator,
                            persistent_workers=False, prefetch_factor=2 if self.num_workers else None)
        return iter(loader)

    def next_batch(self) -> dict[str, Any]:
        """The next batch; starts the next epoch when this one is exhausted."""
        for _ in range(2):
            if self._it is None:
                self._it = self._open()
            try:
                batch = next(self._it)
            except StopIteration:
                if self.consumed == 0:
                    break
                self.epoch, self.consumed, self._it = self.epoch + 1, 0, None
                continue
            self.consumed += 1
            return batch
        raise RuntimeError(f"stream {self.name or '?'}: the sampler yields no batch in epoch {self.epoch} "
                           "(dataset empty or every example longer than the token budget?)")

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "consumed": self.consumed}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
        self._it = None
