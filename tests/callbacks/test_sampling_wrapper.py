"""rank_indices on Lightning's DistributedSamplerWrapper: a wrapped user sampler's own order, not the loader's (a
``hasattr(sampler, "_sampler")`` check matched nothing and re-iterated it as if its order were the loader's)."""

import torch
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from layerwise.engines.sampling import rank_indices


def test_plain_distributed_sampler_gives_indices():
    data = list(range(10))
    loader = DataLoader(data, sampler=DistributedSampler(data, num_replicas=2, rank=1, shuffle=False), batch_size=2)
    assert rank_indices(loader) == [1, 3, 5, 7, 9]


def test_wrapped_user_sampler_gives_none():
    data = list(range(10))
    wrapped = DistributedSamplerWrapper(RandomSampler(data, generator=torch.Generator()), num_replicas=2, rank=0)
    loader = DataLoader(data, sampler=wrapped, batch_size=2)
    assert not hasattr(wrapped, "_sampler")  # what the old check looked for: never there
    assert rank_indices(loader) is None
