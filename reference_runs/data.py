"""Synthetic token data that a tiny model can learn, and the DP-sharded loader over it.

Sequences follow a fixed random "bigram-ish" rule: every token has `branching` allowed
successors, drawn once from the seed, and each next token is one of them picked uniformly. The
best achievable loss is therefore ln(branching) (1.39 nats for 4), well below the ln(vocab) of an
untrained model, so a few optimizer steps visibly reduce the loss.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

Batch = tuple[torch.Tensor, torch.Tensor]


class SyntheticTokens(Dataset[Batch]):
    """`num_samples` (input, target) pairs of `seq_len` tokens; target is input shifted by one."""

    def __init__(
        self, num_samples: int, seq_len: int, vocab: int, seed: int = 0, branching: int = 4
    ) -> None:
        if num_samples < 1 or seq_len < 1 or vocab < 2 or branching < 1:
            raise ValueError(
                f"need num_samples >= 1, seq_len >= 1, vocab >= 2, branching >= 1; got "
                f"num_samples={num_samples}, seq_len={seq_len}, vocab={vocab}, "
                f"branching={branching}"
            )
        self.num_samples = num_samples
        self.seq_len = seq_len
        self.vocab = vocab
        self.seed = seed
        gen = torch.Generator().manual_seed(seed)
        # successors[t] = the tokens allowed to follow token t
        self.successors = torch.randint(vocab, (vocab, branching), generator=gen)
        tokens = torch.empty(num_samples, seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(vocab, (num_samples,), generator=gen)
        choices = torch.randint(branching, (num_samples, seq_len), generator=gen)
        for i in range(seq_len):
            tokens[:, i + 1] = self.successors[tokens[:, i], choices[:, i]]
        self.tokens = tokens

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> Batch:
        row = self.tokens[index]
        return row[:-1], row[1:]


def make_loader(
    dataset: Dataset[Batch],
    micro_batch: int,
    dp_rank: int,
    dp_size: int,
    seed: int,
    drop_last: bool = True,
) -> tuple[DataLoader[Batch], DistributedSampler[Batch]]:
    """A loader over this DP rank's shard. No process group is needed: the sampler is told
    `num_replicas` and `rank` explicitly."""
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"need 0 <= dp_rank < dp_size, got dp_rank={dp_rank}, dp_size={dp_size}")
    sampler: DistributedSampler[Batch] = DistributedSampler(
        dataset, num_replicas=dp_size, rank=dp_rank, shuffle=True, seed=seed
    )
    loader = DataLoader(dataset, batch_size=micro_batch, sampler=sampler, drop_last=drop_last)
    return loader, sampler


def epoch_order(loader: DataLoader[Batch], sampler: DistributedSampler[Batch]) -> list[int]:
    """The sample indices this rank's loader yields in the sampler's current epoch, in order
    (the sampler's shuffle is a pure function of seed and epoch; a dropped last batch is cut)."""
    indices = list(iter(sampler))
    if loader.drop_last and loader.batch_size:
        indices = indices[: len(indices) // loader.batch_size * loader.batch_size]
    return indices


def order_hash(indices: list[int]) -> str:
    """A short stable digest of a sample order: equal orders give equal hashes."""
    return hashlib.sha256(",".join(map(str, indices)).encode()).hexdigest()[:16]


def iterate_batches(
    loader: DataLoader[Batch],
    sampler: DistributedSampler[Batch],
    set_epoch: bool,
    on_epoch: Callable[..., Any] | None = None,
) -> Iterator[Batch]:
    """Yield batches forever, epoch after epoch.

    With `set_epoch` the sampler is re-seeded each epoch (`sampler.set_epoch(epoch)`), so each
    epoch is a new shuffle. Without it (the `no-set-epoch` injection, failure 3 of the seed
    digest) the sampler stays at epoch 0 and every epoch repeats the identical order.

    `on_epoch` (e.g. a recorder's `event`) is called as each epoch starts with
    `("epoch", epoch=e, order_hash=h, samples=n)`: the hash of the sample indices this rank sees
    in that epoch, so identical hashes across epochs expose a forgotten `set_epoch`.
    """
    if len(loader) == 0:
        raise ValueError(
            f"the loader yields no batches (dataset shard of {len(sampler)} samples is smaller "
            f"than one micro-batch with drop_last)"
        )
    epoch = 0
    while True:
        if set_epoch:
            sampler.set_epoch(epoch)
        if on_epoch is not None:
            indices = epoch_order(loader, sampler)
            on_epoch("epoch", epoch=epoch, order_hash=order_hash(indices), samples=len(indices))
        yield from loader
        epoch += 1
