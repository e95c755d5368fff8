"""Neural collapse complete (NC1, CDNV, NC2, NC3, NC4) against float64 numpy references written from the definitions.

The references below loop over classes and pairs on the whole feature matrix, as the definitions read (docs of
``LayerNeuralCollapse``); the metric streams uneven batches far from the origin. DDP: 1, 2 and 3 gloo processes on
451 samples (the last batch of each rank uneven) give the same values.
"""

import os
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers import free_port, run_forked

from layerwise.metrics import LayerNC1, LayerNeuralCollapse, all_reduce_sum_states, neural_collapse_measures

L, D, DH, C = 3, 6, 5, 5
SPLITS = (7, 13, 1, 16, 40)  # uneven, with a batch of one
KEYS = (
    "cdnv",
    "nc2_equinorm",
    "nc2_cos_std",
    "nc2_equiangular",
    "nc2_etf",
    "nc3",
    "nc3_duality",
    "nc4_agreement",
    "nc4_ncc_accuracy",
)


def make_data(n: int, seed: int = 0, offset: float = 0.0):
    """Features (L, n, d) with class structure, head inputs (L, n, d'), head predictions (L, n), targets, W (C+1, d').

    Class C is never a target (absent classes are left out of K); the predictions agree with the NCC in part.
    """
    g = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, C, (n,), generator=g)
    centres = 2.0 * torch.randn(L, C, D, generator=g, dtype=torch.float64)
    features = (
        centres[:, targets]
        + torch.randn(L, n, D, generator=g, dtype=torch.float64) * torch.linspace(1.5, 0.5, L).view(-1, 1, 1).double()
    )
    head_inputs = torch.tanh(features[..., :DH] - 0.3) + 0.1 * torch.randn(L, n, DH, generator=g, dtype=torch.float64)
    weight = torch.randn(C + 1, DH, generator=g, dtype=torch.float64)
    noise = torch.randint(0, C + 1, (L, n), generator=g)
    keep = torch.rand(L, n, generator=g) < 0.7
    predictions = torch.where(keep, targets.expand(L, -1), noise)
    return features + offset, head_inputs, predictions, targets, weight


# -------------------------------------------------------------------------------------------- numpy references
def reference(h: np.ndarray, y: np.ndarray, pred: np.ndarray, hin: np.ndarray, w: np.ndarray) -> dict[str, float]:
    """Every measure of one layer from its definition: h (N, d), y (N,), pred (N,), hin (N, d'), w (C+1, d')."""
    classes = np.unique(y)
    k = len(classes)
    mu = np.stack([h[y == c].mean(axis=0) for c in classes])
    sigma2 = np.array([np.mean([np.sum((row - mu[i]) ** 2) for row in h[y == c]]) for i, c in enumerate(classes)])
    cdnv = [(sigma2[a] + sigma2[b]) / (2 * np.sum((mu[a] - mu[b]) ** 2)) for a in range(k) for b in range(k) if a != b]
    centred = mu - mu.mean(axis=0)
    norms = np.sqrt((centred**2).sum(axis=1))
    cosines = [
        centred[a] @ centred[b] / (norms[a] * norms[b]) for a in range(k) for b in range(a + 1, k)
    ]  # each unordered pair once
    etf = (np.eye(k) - np.ones((k, k)) / k) / np.sqrt(k - 1)  # ||I - 11^T/K||_F = sqrt(K - 1)
    gram = centred @ centred.T
    head_mu = np.stack([hin[y == c].mean(axis=0) for c in classes])
    head_centred = head_mu - head_mu.mean(axis=0)
    rows = w[classes]
    distance = np.mean(
        [np.linalg.norm(rows[i] / np.linalg.norm(rows[i]) - m / np.linalg.norm(m)) for i, m in enumerate(head_centred)]
    )
    duality = rows @ head_centred.T
    nearest = classes[np.argmin([[np.sum((row - m) ** 2) for m in mu] for row in h], axis=1)]
    return {
        "cdnv": float(np.mean(cdnv)),
        "nc2_equinorm": float(np.std(norms, ddof=1) / np.mean(norms)),
        "nc2_cos_std": float(np.std(cosines)),
        "nc2_equiangular": float(np.mean(np.abs(np.array(cosines) + 1 / (k - 1)))),
        "nc2_etf": float(np.linalg.norm(gram / np.linalg.norm(gram) - etf)),
        "nc3": float(distance),
        "nc3_duality": float(np.linalg.norm(duality / np.linalg.norm(duality) - etf)),
        "nc4_agreement": float(np.mean(nearest == pred)),
        "nc4_ncc_accuracy": float(np.mean(nearest == y)),
    }


def references(n: int, offset: float = 0.0) -> dict[str, np.ndarray]:
    h, hin, pred, y, w = (value.numpy() for value in make_data(n, offset=offset))
    rows = [reference(h[layer] - offset, y, pred[layer], hin[layer], w) for layer in range(L)]
    return {key: np.array([row[key] for row in rows]) for key in KEYS}


def streamed(n: int, splits, start: int = 0, offset: float = 1e4, **kwargs) -> LayerNeuralCollapse:
    features, head_inputs, predictions, targets, _ = make_data(n, offset=offset)
    metric = LayerNeuralCollapse(L, D, C + 1, head_dim=DH, ncc=True, **kwargs)
    for size in splits:
        rows = slice(start, start + size)
        metric.update(features[:, rows], targets[rows], predictions[:, rows], head_inputs[:, rows])
        start += size
    return metric


def computed(metric: LayerNeuralCollapse, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    metric.classifier = weight
    return metric.compute()


# ----------------------------------------------------------------------------------------------------- the tests
def test_every_measure_equals_the_definition_on_the_full_matrix():
    n = sum(SPLITS)
    expected = references(n)
    features, head_inputs, predictions, targets, weight = make_data(n, offset=1e4)
    whole = neural_collapse_measures(features, targets, C + 1, predictions, head_inputs, weight)
    metric = computed(streamed(n, SPLITS), weight)
    assert 0.3 < expected["nc4_agreement"].min() and expected["nc4_agreement"].max() < 1.0  # neither trivial
    for key in KEYS:
        np.testing.assert_allclose(whole[key].numpy(), expected[key], rtol=1e-10, atol=0, err_msg=key)
        np.testing.assert_allclose(metric[key].numpy(), expected[key], rtol=1e-10, atol=0, err_msg=key)
    nc1 = LayerNC1(L, D, C + 1)
    for size, start in zip(SPLITS, np.cumsum((0, *SPLITS))):
        nc1.update(features[:, start : start + size], targets[start : start + size])
    torch.testing.assert_close(metric["nc1"], nc1.compute(), rtol=0, atol=0)  # NC1 from the same states


def test_collapsed_features_reach_the_ideal_values():
    """A simplex ETF of class means, no within-class spread, the head's rows the means: every measure at its ideal."""
    k, n = 4, 40
    targets = torch.arange(n) % k
    etf = torch.eye(k, dtype=torch.float64) - 1.0 / k
    features = (3.0 * etf[targets] + 7.0).expand(2, -1, -1)  # (2, n, k), offset by 7
    head_inputs = etf[targets].expand(2, -1, -1)
    predictions = targets.expand(2, -1)
    result = neural_collapse_measures(features, targets, k, predictions, head_inputs, etf.clone())
    for key in ("nc1", "cdnv", "nc2_equinorm", "nc2_cos_std", "nc2_equiangular", "nc2_etf", "nc3", "nc3_duality"):
        assert result[key].abs().max() < 1e-7, key
    assert torch.equal(result["nc4_agreement"], torch.ones(2, dtype=torch.float64))


def test_a_buffer_past_its_limit_leaves_nc4_out_and_says_so():
    n = sum(SPLITS)
    _, _, _, _, weight = make_data(n)
    with pytest.warns(UserWarning, match="max_buffered_samples=30"):
        metric = streamed(n, SPLITS, max_buffered_samples=30)
    result = computed(metric, weight)
    assert result["nc4_agreement"].isnan().all() and result["nc4_ncc_accuracy"].isnan().all()
    assert result["cdnv"].isfinite().all()  # the streamed measures are unaffected
    metric.reset()
    assert metric._buffer == [] and not metric._overflowed


def test_update_names_what_is_missing():
    metric = LayerNeuralCollapse(L, D, C, head_dim=DH, ncc=True)
    features = torch.randn(L, 4, D)
    with pytest.raises(ValueError, match="needs `head_inputs`"):
        metric.update(features, torch.zeros(4, dtype=torch.long), torch.zeros(L, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="needs `predictions`"):
        metric.update(features, torch.zeros(4, dtype=torch.long), None, torch.randn(L, 4, DH))
    metric.classifier = torch.randn(C, DH + 1)
    with pytest.raises(ValueError, match=r"classifier weight of shape \(5, 5\)"):
        metric.compute()


# ---------------------------------------------------------------------------------------------------------- DDP
N_DDP = 451
BATCH = 32


def rank_batches(rank: int, world_size: int) -> list[tuple[int, int]]:
    """(start, size) of this rank's batches: contiguous shares of 451 samples, each ending in a short batch."""
    share = -(-N_DDP // world_size)
    first, last = rank * share, min(N_DDP, (rank + 1) * share)
    return [(start, min(BATCH, last - start)) for start in range(first, last, BATCH)]


def ddp_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        features, head_inputs, predictions, targets, weight = make_data(N_DDP, offset=1e4)
        metric = LayerNeuralCollapse(L, D, C + 1, head_dim=DH, ncc=True, sync_on_compute=False)
        for start, size in rank_batches(rank, world_size):
            rows = slice(start, start + size)
            metric.update(features[:, rows], targets[rows], predictions[:, rows], head_inputs[:, rows])
        all_reduce_sum_states([metric])  # each rank's sums around its own first batch's mean, aligned here
        metric.classifier = weight
        torch.save(metric.compute(), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(sys.platform != "linux" or not dist.is_available(), reason="needs fork and torch.distributed")
@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_ranks_equal_one_process(tmp_path, world_size):
    sizes = [size for rank in range(world_size) for _, size in rank_batches(rank, world_size)]
    assert sum(sizes) == N_DDP and len(set(sizes)) > 1  # uneven last batches
    run_forked(ddp_worker, (world_size, free_port(), str(tmp_path)), nprocs=world_size, timeout_s=120)
    features, head_inputs, predictions, targets, weight = make_data(N_DDP, offset=1e4)
    one = LayerNeuralCollapse(L, D, C + 1, head_dim=DH, ncc=True)
    for start in range(0, N_DDP, BATCH):
        rows = slice(start, start + BATCH)
        one.update(features[:, rows], targets[rows], predictions[:, rows], head_inputs[:, rows])
    single = computed(one, weight)
    expected = references(N_DDP)
    for key in KEYS:
        np.testing.assert_allclose(single[key].numpy(), expected[key], rtol=1e-10, atol=0, err_msg=key)
    for rank in range(world_size):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        assert result.keys() == single.keys()
        for key, value in single.items():
            torch.testing.assert_close(result[key], value, rtol=1e-10, atol=1e-12, msg=f"rank {rank}: {key}")
