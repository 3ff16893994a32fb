"""A plain DataLoader over one pretraining dataset (the stages use resumable BatchStreams)."""

from __future__ import annotations

from torch.utils.data import DataLoader

from pipeline.pretrain.datasets import PretrainDataset
from pipeline.training.batching import TokenBucketSampler, collate_pretrain


def pretrain_loader(dataset: PretrainDataset, *, batch_tokens: int, seed: int, rank: int = 0, world_size: int = 1,
                    num_workers: int = 0, bucket_size: int = 8192) -> tuple[DataLoader, TokenBucketSampler]:
    """A DataLoader over ``dataset`` with a :class:`TokenBucketSampler`, and the sampler; call
    ``sampler.set_epoch`` and ``dataset.set_epoch`` together at each epoch."""
    sampler = TokenBucketSampler(dataset.txt_lens, dataset.img_lens, batch_tokens=batch_tokens,
                                 bucket_size=bucket_size, seed=seed, rank=rank, world_size=world_size)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_pretrain, num_workers=num_workers,
                        persistent_workers=False, pin_memory=False)
    return loader, sampler
