"""Mutual k-NN and CKNNA against float64 numpy references, and the seeded row sample on 1, 2 and 3 gloo processes."""

import os
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
from _neighbour_reference import cknna, mutual_knn, sampled_indices, splitmix64
from helpers import free_port, run_forked

from layerwise.metrics import LayerRowSample
from layerwise.metrics.functional_neighbours import NEIGHBOUR_MEASURES, neighbour_measures, sample_keys

N, L, D, SIZE, K, SEED = 61, 3, 6, 24, 4, 7
# contiguous slices per rank, in batches of different sizes; every rank's last batch is short
SPLITS = {
    1: ((16, 16, 16, 13),),
    2: ((9, 9, 9, 4), (7, 7, 7, 7, 2)),
    3: ((5, 5, 5, 5, 1), (11, 9), (6, 6, 6, 2)),
}


def make_features():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(N, D, generator=g, dtype=torch.float64)
    layers = [base]
    for _ in range(L - 1):
        layers.append(torch.tanh(layers[-1] @ torch.randn(D, D, generator=g, dtype=torch.float64)) + 0.3 * base)
    return torch.stack(layers)


def reference(rows: np.ndarray, k: int) -> dict[str, np.ndarray]:
    return {
        "mutual_knn": np.array([[mutual_knn(a, b, k) for b in rows] for a in rows]),
        "cknna": np.array([[cknna(a, b, k) for b in rows] for a in rows]),
    }


def test_measures_equal_the_numpy_reference_of_platonic_rep():
    rows = make_features() * torch.linspace(0.5, 3.0, N, dtype=torch.float64)[:, None]  # norms matter not
    values = neighbour_measures(rows, NEIGHBOUR_MEASURES, K)
    expected = reference(rows.numpy(), K)
    for name in NEIGHBOUR_MEASURES:
        np.testing.assert_allclose(values[name].numpy(), expected[name], rtol=0, atol=1e-10, err_msg=name)
    assert 0.0 < values["mutual_knn"][0, 1] < 1.0 and 0.0 < values["cknna"][0, 1] < 1.0
    np.testing.assert_allclose(values["mutual_knn"].diagonal().numpy(), 1.0)


def test_pairs_limit_the_computed_entries_and_few_rows_give_nan():
    rows = make_features()
    values = neighbour_measures(rows, ["cknna"], K, pairs=[(0, 2), (1, 2), (2, 2)])
    assert set(values) == {"cknna"}
    assert torch.isnan(values["cknna"][:, :2]).all() and torch.isfinite(values["cknna"][:, 2]).all()
    assert torch.isnan(neighbour_measures(rows[:, :K], NEIGHBOUR_MEASURES, K)["mutual_knn"]).all()


def test_keys_are_splitmix64_of_the_index():
    index = np.array([0, 1, 2, 5, 2**40, 123456789])
    assert sample_keys(index, SEED).tolist() == splitmix64(index, SEED)


def rank_sample(rank: int, world_size: int) -> LayerRowSample:
    features = make_features()
    start = sum(sum(split) for split in SPLITS[world_size][:rank])
    metric = LayerRowSample(L, SIZE, SEED)
    for size in SPLITS[world_size][rank]:
        metric.update(features[:, start : start + size], torch.arange(start, start + size))
        start += size
    return metric


def test_the_sample_is_the_rows_of_lowest_key_in_index_order():
    rows = rank_sample(0, 1).compute()
    chosen = sampled_indices(N, SIZE, SEED)
    torch.testing.assert_close(rows, make_features()[:, chosen], rtol=0, atol=0)
    batch = LayerRowSample(L, SIZE, SEED)  # one batch, shuffled: the same rows in the same order
    order = torch.randperm(N, generator=torch.Generator().manual_seed(1))
    batch.update(make_features()[:, order], order)
    torch.testing.assert_close(batch.compute(), rows, rtol=0, atol=0)
    with pytest.raises(ValueError, match="global sample index"):
        batch.update(make_features(), None)


def worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        rows = rank_sample(rank, world_size).compute()
        torch.save(
            {"rows": rows, **neighbour_measures(rows, NEIGHBOUR_MEASURES, K)}, os.path.join(out_dir, f"{rank}.pt")
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(sys.platform != "linux" or not dist.is_available(), reason="needs fork and torch.distributed")
@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_equal_one_process(tmp_path, world_size):
    assert all(sum(map(sum, splits)) == N for splits in SPLITS.values())
    rows = rank_sample(0, 1).compute()
    single = {"rows": rows, **neighbour_measures(rows, NEIGHBOUR_MEASURES, K)}
    expected = reference(make_features()[:, sampled_indices(N, SIZE, SEED)].numpy(), K)
    for name in NEIGHBOUR_MEASURES:
        np.testing.assert_allclose(single[name].numpy(), expected[name], rtol=0, atol=1e-10, err_msg=name)
    run_forked(worker, (world_size, free_port(), str(tmp_path)), nprocs=world_size, timeout_s=120)
    for rank in range(world_size):
        values = torch.load(tmp_path / f"{rank}.pt")
        for key, value in values.items():
            torch.testing.assert_close(value, single[key], rtol=0, atol=0, msg=f"rank {rank}: {key}")
