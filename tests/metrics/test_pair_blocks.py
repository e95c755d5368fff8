"""``LayerCKA(pairs="to_last" | "adjacent")``: an O(L d^2) state whose values equal the full state's and numpy's.

The full state keeps the stacked (L d)^2 second moment; with some pairs the metric keeps the 2L - 1 (d, d) blocks
they read. At the kept pairs CKA, debiased CKA and every second-moment measure equal the ``"all"`` metric's and a
float64 numpy reference on the full feature matrix (1e-10), for features far from 0 in uneven batches.
"""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from layerwise.analyses.layer_spec import LayerSpec
from layerwise.analyses.pool import Pool
from layerwise.metrics import LayerCKA
from layerwise.metrics.functional_family import MEASURES, computed_pairs

sys.path.insert(0, str(Path(__file__).parent))
import _family_reference as ref  # noqa: E402

L, D, N = 5, 4, 53
BATCHES = (16, 16, 16, 5)  # an uneven last batch


def features() -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    base = torch.randn(N, D, generator=g, dtype=torch.float64)
    layers = [base @ torch.randn(D, D, generator=g, dtype=torch.float64) for _ in range(L)]
    return torch.stack(layers) + 0.4 * torch.randn(L, N, D, generator=g, dtype=torch.float64) + 1e3


def fed(pairs: str, x: torch.Tensor) -> LayerCKA:
    metric = LayerCKA(L, D, debiased=True, pairs=pairs)
    start = 0
    for size in BATCHES:
        metric.update(x[:, start : start + size])
        start += size
    return metric


def reference(name: str, x: np.ndarray, y: np.ndarray) -> float:
    if name == "cka":
        x, y = ref.centred(x), ref.centred(y)
        return np.linalg.norm(x.T @ y) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))
    if name == "shape":
        return ref.shape_distance(x, y, 0.5)
    return ref.debiased_cka(x, y) if name == "debiased_cka" else ref.PAIR[name](x, y)


@pytest.mark.parametrize("pairs", ["to_last", "adjacent"])
def test_state_is_linear_in_the_layers(pairs):
    for layers, dim in ((4, 8), (8, 8), (16, 8)):
        full, some = LayerCKA(layers, dim, debiased=True), LayerCKA(layers, dim, debiased=True, pairs=pairs)
        elements = {name: value.numel() for name, value in some.metric_state.items()}
        assert elements["blocks"] == (2 * layers - 1) * dim * dim  # the diagonal blocks and L - 1 pairs
        assert "cross" not in elements and elements["norm_products"] == 2 * layers - 1
        assert sum(elements.values()) <= 2 * layers * dim * dim + 6 * layers * dim + 2 * layers  # O(L d^2)
        assert full.metric_state["cross"].numel() == (layers * dim) ** 2
    # what the memory line before a run counts (Pool.state_bytes): the smaller state
    spec = LayerSpec(list(range(1, 13)), 12, 768, 10)
    from layerwise.callbacks import LayerSimilarityMonitor

    def cka_bytes(**options) -> int:
        analysis = LayerSimilarityMonitor(cos_bins=0, **options)
        analysis.spec = spec
        return Pool(analysis.statistics(spec).values()).state_bytes()[analysis.statistics(spec)["cka"].name]

    assert cka_bytes() > 8 * (12 * 768) ** 2  # 680 MB
    assert 8 * 23 * 768**2 <= cka_bytes(pairs=pairs) < 8 * 23 * 768**2 + 10**6  # 109 MB


@pytest.mark.parametrize("pairs", ["to_last", "adjacent"])
def test_kept_pairs_equal_the_full_state_and_numpy(pairs):
    x = features()
    full, some = fed("all", x), fed(pairs, x)
    wanted = computed_pairs(pairs, L)
    values = {"cka": some.compute(), **some.compute_measures(MEASURES, pairs=wanted)}
    whole = {"cka": full.compute(), **full.compute_measures(MEASURES)}
    h = x.numpy()
    kept = {(a, b) for a, b in wanted} | {(b, a) for a, b in wanted}
    for name, value in values.items():
        if name == "effective_rank":
            torch.testing.assert_close(value, whole[name], rtol=0, atol=1e-10)
            continue
        cells = kept | {(a, a) for a in range(L)} if name in ("cka", "debiased_cka") else set(wanted)
        for a in range(L):
            for b in range(L):
                if (a, b) not in cells:
                    assert value[a, b].isnan(), f"{name} at the pair ({a}, {b}) not computed"
                    continue
                assert abs(float(value[a, b]) - float(whole[name][a, b])) <= 1e-10, (name, a, b)
                if a != b:
                    assert abs(float(value[a, b]) - reference(name, h[a], h[b])) <= 1e-10, (name, a, b)


def test_merged_and_unknown_pairs():
    x = features()
    one, two = LayerCKA(L, D, debiased=True, pairs="adjacent"), LayerCKA(L, D, debiased=True, pairs="adjacent")
    one.update(x[:, :20])
    two.update(x[:, 20:] * 1.0 - 3.0)  # another shift
    one.merge_state(two)
    other = LayerCKA(L, D, debiased=True, pairs="adjacent")
    other.update(x[:, :20])
    other.update(x[:, 20:] - 3.0)
    torch.testing.assert_close(one.compute(), other.compute(), rtol=0, atol=1e-12, equal_nan=True)
    merged, single = (metric.compute_measures(["debiased_cka"])["debiased_cka"] for metric in (one, other))
    torch.testing.assert_close(merged, single, rtol=0, atol=1e-12, equal_nan=True)
    with pytest.raises(KeyError, match=r"layer pair \(0, 3\) is not kept"):
        one.compute_measures(["cca"], pairs=[(0, 3)])
    with pytest.raises(ValueError, match="`pairs='some'` must be"):
        LayerCKA(L, D, pairs="some")
