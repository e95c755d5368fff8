"""The second-moment measures on 1, 2 and 3 gloo processes: equal, with uneven splits and an uneven last batch.

Every rank takes its sums around its own shift (its first batch's mean); the ranks' shifts are aligned before the
one all-reduce, debiased CKA's two extra sums included, so the measures match one process to 1e-9. The same for
``LayerCKA(pairs="to_last" | "adjacent")``'s O(L d^2) blocks, whose values equal the full state's at the kept pairs.
"""

import os
import sys
from contextlib import ExitStack

import pytest
import torch
import torch.distributed as dist
from helpers import free_port, run_forked

from layerwise.metrics import CrossModelCKA, LayerCKA, all_reduce_sum_states
from layerwise.metrics.functional_family import MEASURES, computed_pairs

N, L, D = 41, 3, 5
# contiguous slices of the 41 samples per rank, in batches; the last batch of every rank is short
SPLITS = {
    1: ((16, 16, 9),),
    2: ((8, 8, 4), (8, 8, 5)),
    3: ((6, 6, 2), (7, 3), (6, 6, 5)),
}
CROSS = [name for name in MEASURES if name != "debiased_cka"]


def make_data():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(N, D, generator=g, dtype=torch.float64)
    scale = torch.logspace(0, -1.5, D, dtype=torch.float64)
    features = torch.stack([(base @ torch.randn(D, D, generator=g, dtype=torch.float64)) * scale for _ in range(L)])
    features = features + 0.5 * torch.randn(L, N, D, generator=g, dtype=torch.float64) + 1e3
    other = features[1:, :, :3] ** 2 / 1e3 + 0.3 * features[:-1, :, 2:] - 2e3  # model B: 2 layers of width 3
    return features, other


PAIRS = ("to_last", "adjacent")  # LayerCKA(pairs=...): the O(L d^2) blocks, reduced in the same all-reduce


def run(rank: int, world_size: int, **kwargs):
    features, other = make_data()
    start = sum(sum(split) for split in SPLITS[world_size][:rank])
    within = LayerCKA(L, D, debiased=True, **kwargs)
    across = CrossModelCKA(L, D, L - 1, 3, **kwargs)
    some = [LayerCKA(L, D, debiased=True, pairs=pairs, **kwargs) for pairs in PAIRS]
    for size in SPLITS[world_size][rank]:
        within.update(features[:, start : start + size])
        across.update(features[:, start : start + size], other[:, start : start + size])
        for metric in some:
            metric.update(features[:, start : start + size])
        start += size
    return within, across, *some


def computed(within, across, *some):
    values = {f"within/{name}": value for name, value in within.compute_measures(MEASURES, alpha=0.3).items()}
    plain = not within.sync_on_compute  # compute() syncs by itself otherwise: the CKA on the packed states only
    if plain:
        values["within/cka"] = within.compute()
    values.update({f"across/{name}": value for name, value in across.compute_measures(CROSS, alpha=0.3).items()})
    for pairs, metric in zip(PAIRS, some):
        measures = metric.compute_measures(MEASURES, alpha=0.3, pairs=computed_pairs(pairs, L))
        values.update({f"{pairs}/{name}": value for name, value in measures.items()})
        if plain:
            values[f"{pairs}/cka"] = metric.compute()
    return values


def worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        metrics = run(rank, world_size, sync_on_compute=False)
        all_reduce_sum_states(list(metrics))
        results = {"packed": computed(*metrics)}
        metrics = run(rank, world_size)  # torchmetrics' own sync around compute ...
        with ExitStack() as stack:  # ... here around compute_measures
            for metric in metrics:
                stack.enter_context(metric.sync_context())
            results["torchmetrics"] = computed(*metrics)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(sys.platform != "linux" or not dist.is_available(), reason="needs fork and torch.distributed")
@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_equal_one_process(tmp_path, world_size):
    assert all(sum(map(sum, splits)) == N for splits in SPLITS.values())
    single = computed(*run(0, 1, sync_on_compute=False))
    assert all(
        value.isfinite().all()
        for key, value in single.items()
        if key.startswith(("within", "across")) and "svcca" not in key
    )
    for pairs in PAIRS:  # the kept pairs equal the full state's; the others are NaN
        for name in ("cka", "debiased_cka", "cca", "pwcca", "procrustes", "shape", "effective_rank"):
            value, whole = single[f"{pairs}/{name}"], single[f"within/{name}"]
            kept = value.isfinite()
            assert kept.any() and (name == "effective_rank" or not kept.all())
            torch.testing.assert_close(value[kept], whole[kept], rtol=0, atol=1e-10, msg=f"{pairs}/{name}")
    run_forked(worker, (world_size, free_port(), str(tmp_path)), nprocs=world_size, timeout_s=120)
    for rank in range(world_size):
        for mode, values in torch.load(tmp_path / f"rank{rank}.pt").items():
            assert values.keys() == {key for key in single if mode == "packed" or not key.endswith("/cka")}
            for key, value in values.items():
                torch.testing.assert_close(value, single[key], rtol=0, atol=1e-9, equal_nan=True, msg=f"{mode}/{key}")
