"""DDP on CPU with gloo and 2 processes: the 2-rank result equals the 1-rank result on the same data.

Processes are started with torch.multiprocessing's "fork" method: under "spawn" every child re-imports torch and
torchmetrics (over 10 s each on a loaded 2-core CI box), while the collective part of the test takes well under a
second. The children set a single intra-op thread before any work, as DataLoader workers do, so a forked OpenMP
pool is never used.
"""

import os
import sys

import pytest
import torch
import torch.distributed as dist
from helpers import free_port, run_forked

from layerwise.metrics import (
    EarlyExit,
    LayerAccuracy,
    LayerCKA,
    LayerCosineSimilarity,
    LayerF1,
    LayerMean,
    LayerNC1,
    LensStatistics,
    SaturationCosine,
    SaturationHistogram,
    all_reduce_sum_states,
    readout_from_logits,
    saturation_layers,
)
from layerwise.metrics.compare import CrossModelCKA
from layerwise.metrics.functional import reference_rows
from layerwise.metrics.residual import ResidualNormRatio
from layerwise.metrics.similarity import PairedCosine

N, L, D, C = 37, 3, 5, 4
RANK_SPLITS = ((11, 8), (5, 13))  # rank 0 gets samples 0..18, rank 1 gets 19..36
SINGLE_SPLITS = (20, 17)


def make_data():
    g = torch.Generator().manual_seed(0)
    targets = torch.randint(0, C, (N,), generator=g)
    base = torch.randn(N, D, generator=g)
    features = torch.stack([base @ torch.randn(D, D, generator=g) + torch.randn(N, D, generator=g) for _ in range(L)])
    features += 3.0 * torch.randn(C, D, generator=g)[targets] + 10.0
    logits = 2.0 * torch.randn(L, N, C, generator=g)
    logits += torch.linspace(0.0, 3.0, L).view(-1, 1, 1) * torch.nn.functional.one_hot(targets, C)
    return features, logits, targets


def build_metrics(**kwargs):
    return {
        "cos_centered": LayerCosineSimilarity(L, **kwargs),
        "cos_centered_dim": LayerCosineSimilarity(L, dim=D, **kwargs),
        "cos": LayerCosineSimilarity(L, center=False, **kwargs),
        "saturation_cos_centered": SaturationCosine(L, **kwargs),
        "saturation_cos": SaturationCosine(L, center=False, **kwargs),
        "cka": LayerCKA(L, D, **kwargs),
        "accuracy": LayerAccuracy(L, **kwargs),
        "accuracy_readout": LayerAccuracy(L, **kwargs),  # fed the chunked readout, as for language models
        "f1": LayerF1(L, **kwargs),
        "histogram": SaturationHistogram(L, **kwargs),
        "early_exit": EarlyExit(L, thresholds=(0.3, 0.6, 0.9), layer_numbers=(2, 4, 6), depth=8, **kwargs),
        "nc1": LayerNC1(L, D, C + 1, **kwargs),
        # the same data with a common offset of 1e6 (float64): the ranks' shifts are aligned before the sum
        "cka_offset": LayerCKA(L, D, **kwargs),
        "nc1_offset": LayerNC1(L, D, C + 1, **kwargs),
        "cos_offset": LayerCosineSimilarity(L, **kwargs),
        # the distribution of the per-sample COS (histogram and negative fraction), centred and not
        "cos_distribution": LayerCosineSimilarity(L, bins=16, **kwargs),
        "cos_distribution_uncentered": LayerCosineSimilarity(L, center=False, bins=16, **kwargs),
        # two "models" of different depth and width on the same tokens, far from the origin
        "cross_cka": CrossModelCKA(L, D, L - 1, 3, **kwargs),
        "cross_cka_diagonal": CrossModelCKA(L - 1, D, L - 1, 3, pairs="diagonal", **kwargs),
        # float32 features, float32 products: each rank rounds around its own shift, so equal within rounding only
        "fast_cross_cka": CrossModelCKA(L, D, L - 1, 3, precision="fast", **kwargs),
        "residual_ratio": ResidualNormRatio(2, L, levels=(0.1, 0.5, 0.9), bins=50, **kwargs),
        # a range narrower than the ratios: the counts below and above it are summed too
        "residual_ratio_outside": ResidualNormRatio(2, L, (0.1, 0.5, 0.9), bins=50, low=0.3, high=0.5, **kwargs),
        "paired_cos": PairedCosine(L, L - 1, **kwargs),  # CLIP's image x caption COS
        "layer_mean": LayerMean(L, **kwargs),  # examples/feature_norm.py's statistic: the mean feature norm
        "lens": LensStatistics(L, **kwargs),  # KL to the last layer, entropy, rank of the last layer's top-1
    }


def lens_readout(logits):
    """The lens statistics' fields of per-layer logits (L, B, C), the last layer the reference."""
    readout = readout_from_logits(logits)
    kl, rank = reference_rows(logits, logits[-1:].expand_as(logits))
    log_p = torch.log_softmax(logits.double(), -1)
    return readout._replace(entropy=-(log_p.exp() * log_p).sum(-1), kl_to_final=kl, final_rank=rank)


def run_metrics(start: int, splits, **kwargs):
    features, logits, targets = make_data()
    metrics = build_metrics(**kwargs)
    for size in splits:
        h, lg, t = features[:, start : start + size], logits[:, start : start + size], targets[start : start + size]
        start += size
        saturation = saturation_layers(lg.argmax(-1))
        for name, metric in metrics.items():
            if name == "paired_cos":
                metric.update(h, h[1:] ** 2 - 3.0)
            elif name == "layer_mean":
                metric.update(h.norm(dim=-1))
            elif name.startswith("residual_ratio"):
                metric.update(h.norm(dim=-1).expand(2, -1, -1), (h - 10.0).norm(dim=-1).expand(2, -1, -1))
            elif name == "fast_cross_cka":
                metric.update((h + 1e3).float(), (h[1:, :, :3] ** 2 + 0.5 * h[:-1, :, 2:] - 1e3).float())
            elif name.startswith("cross_cka"):
                other = h[1:, :, :3].double() ** 2 + 0.5 * h[:-1, :, 2:].double() - 1e6
                metric.update((h.double() + 1e6)[: -1 if name.endswith("diagonal") else None], other)
            elif name.endswith("_offset"):
                offset = h.to(torch.float64) + 1e6
                metric.update(offset, t) if name.startswith("nc1") else metric.update(offset)
            elif name.startswith("cos") or name == "cka":
                metric.update(h)
            elif name.startswith("saturation_cos"):
                metric.update(h, saturation)
            elif name == "histogram":
                metric.update(lg)
            elif name == "nc1":
                metric.update(h, t)
            elif name == "lens":
                metric.update(lens_readout(lg))
            elif name == "accuracy_readout":
                metric.update(readout_from_logits(lg, t), t)
            else:
                metric.update(lg, t)
    return metrics


def computed(metrics):
    """Every metric's result; the whole distribution for the COS histograms."""
    return {
        name: metric.compute_distribution()._asdict()
        if name.startswith("cos_distribution")
        else metric.compute()._asdict()
        if name.startswith("residual_ratio")
        else metric.compute()
        for name, metric in metrics.items()
    }


def worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        start = sum(RANK_SPLITS[0]) if rank else 0
        results = {}
        metrics = run_metrics(start, RANK_SPLITS[rank], sync_on_compute=False)
        all_reduce_sum_states(list(metrics.values()))
        results["packed"] = computed(metrics)
        metrics = run_metrics(start, RANK_SPLITS[rank])  # torchmetrics' own sync_on_compute=True
        results["torchmetrics"] = computed(metrics)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def assert_same(actual, expected, where: str) -> None:
    if isinstance(expected, dict):
        assert actual.keys() == expected.keys(), where
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}/{key}")
    else:
        atol = 1e-7 if "fast_cross_cka" in where else 1e-9  # the fast mode's float32 rounding (stated bound: 1e-4)
        torch.testing.assert_close(actual, expected, rtol=0, atol=atol, equal_nan=True, msg=where)


@pytest.mark.skipif(sys.platform != "linux" or not dist.is_available(), reason="needs fork and torch.distributed")
def test_two_ranks_equal_one_rank(tmp_path):
    run_forked(worker, (2, free_port(), str(tmp_path)), nprocs=2, timeout_s=120)

    single = computed(run_metrics(0, SINGLE_SPLITS))
    assert (
        single["cos_distribution"]["histogram"].sum() > 0
        and single["cos_distribution"]["negative_fraction"].gt(0).any()
    )
    outside = single["residual_ratio_outside"]
    assert outside["below"].sum() > 0 and outside["above"].sum() > 0 and outside["count"].sum() > 0
    assert not single["saturation_cos_centered"][:-1].isnan().all()  # some samples saturate early
    assert single["cross_cka"].shape == (L, L - 1) and single["cross_cka"].isfinite().all()
    # the same features up to an offset, in float32: the fast mode within its stated error of the exact one
    torch.testing.assert_close(single["fast_cross_cka"], single["cross_cka"], rtol=0, atol=1e-4)
    for name in ("cka", "nc1", "cos_centered"):  # the offset costs nothing, on one rank or two
        torch.testing.assert_close(single[f"{name.split('_')[0]}_offset"], single[name].double(), rtol=0, atol=1e-9)
    for rank in range(2):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        for mode, values in results.items():
            assert_same(values, single, f"rank{rank}/{mode}")
