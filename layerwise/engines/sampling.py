"""How many of a rank's evaluation samples are real, not the distributed sampler's padding."""

from collections.abc import Mapping, Sequence, Sized
from typing import Any, Optional, cast

import torch.distributed as dist
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from torch.utils.data import DistributedSampler, SequentialSampler


def evaluation_loaders(loaders: Any) -> list[Any]:
    """Lightning's evaluation dataloaders (one, a list, or a dict of named ones) as a list in dataloader order."""
    if isinstance(loaders, Mapping):
        return list(loaders.values())
    return list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]


def _sampler(dataloader: Any) -> Any:
    sampler = getattr(dataloader, "sampler", None)
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    inner = getattr(batch_sampler, "sampler", None)
    return inner if isinstance(inner, DistributedSampler) else sampler


def real_samples_on_rank(dataloader: Any) -> Optional[int]:
    """Number of samples this rank sees before the padding that ``DistributedSampler`` appends, else ``None``.

    ``DistributedSampler(drop_last=False)`` repeats the first indices so every rank gets ``ceil(N / W)`` samples; the
    repeats land at the end of the padded index list, so on rank ``r`` they are the last ones of its stream. Rank ``r``
    owns ``len(range(r, N, W))`` real samples. ``None`` means nothing needs trimming.
    """
    sampler = _sampler(dataloader)
    if not isinstance(sampler, DistributedSampler) or sampler.drop_last:
        return None
    size = len(cast(Sized, sampler.dataset))  # DistributedSampler itself takes the len of its dataset
    if sampler.total_size <= size:  # no padding (e.g. Lightning's unrepeated sampler for predict)
        return None
    return len(range(sampler.rank, size, sampler.num_replicas))


def rank_indices(dataloader: Any) -> Optional[list[int]]:
    """Dataset indices of this rank's real samples in order, when the sampler can say (``DistributedSampler``).

    ``None`` also for Lightning's ``DistributedSamplerWrapper`` (a user sampler wrapped for DDP): iterating it again
    re-draws the inner sampler, so the order would not be the loader's.
    """
    sampler = _sampler(dataloader)
    if not isinstance(sampler, DistributedSampler) or isinstance(sampler, DistributedSamplerWrapper):
        return None
    budget = real_samples_on_rank(dataloader)
    indices = list(iter(sampler))
    return indices if budget is None else indices[:budget]


def sample_indices(dataloader: Any) -> Optional[Sequence[int]]:
    """Dataset indices of this rank's real samples in loader order, where known, else ``None``.

    ``DistributedSampler``: :func:`rank_indices`; a ``SequentialSampler`` on one process: ``0, 1, ..., N-1``; any
    other sampler (shuffled, a user's, or a sequential one on each of several processes): ``None``.
    """
    sampler = _sampler(dataloader)
    if isinstance(sampler, DistributedSampler):
        return rank_indices(dataloader)
    several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if isinstance(sampler, SequentialSampler) and not several:
        return range(len(sampler))
    return None


def take_real(budget: Optional[int], size: int) -> tuple[int, Optional[int]]:
    """How many of the next ``size`` samples of a rank are real, and the budget left after them.

    ``budget`` is what :func:`real_samples_on_rank` gave, minus what earlier batches used (``None``: no padding,
    every sample is real and nothing is counted).
    """
    if budget is None:
        return size, None
    rows = min(size, budget)
    return rows, budget - rows
