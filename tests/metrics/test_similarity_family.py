"""The second-moment similarity measures against float64 numpy references on the full feature matrices.

The references (``_family_reference.py``) work on the (N, d) matrices themselves (N x N Grams, QR, SVD, netrep's
whitening), the package on streamed sums; they agree to 1e-10 on features far from the origin, in uneven batches.
"""

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import _family_reference as ref  # noqa: E402

from layerwise.metrics import CrossModelCKA, LayerCKA  # noqa: E402
from layerwise.metrics.functional_family import MEASURES, check_measures, similarity_measures  # noqa: E402

L, N, D = 4, 90, 6
ATOL = 1e-10


def make_features(layers=L, n=N, dim=D, seed=0, offset=50.0):
    """Correlated layers with decaying spectra (so SVCCA truncates), different scales, far from the origin."""
    g = np.random.default_rng(seed)
    base = g.standard_normal((n, dim))
    spectrum = np.geomspace(1.0, 0.02, dim)
    layers_ = [
        (base @ g.standard_normal((dim, dim)) + 0.7 * g.standard_normal((n, dim))) * spectrum * (1 + layer)
        for layer in range(layers)
    ]
    return np.stack(layers_) + offset


def reference(features_a, features_b, name, alpha=0.5, variance=0.99):
    if name == "shape":
        return np.array([[ref.shape_distance(x, y, alpha) for y in features_b] for x in features_a])
    if name == "svcca":
        return np.array([[ref.svcca(x, y, variance) for y in features_b] for x in features_a])
    return np.array([[ref.PAIR[name](x, y) for y in features_b] for x in features_a])


def streamed(features, splits=(7, 30, 1, 41, 11), **kwargs):
    metric = LayerCKA(features.shape[0], features.shape[2], debiased=True)
    start = 0
    for size in splits:
        metric.update(torch.from_numpy(features[:, start : start + size]))
        start += size
    assert start == features.shape[1]
    return metric.compute_measures(MEASURES, **kwargs)


def test_svcca_truncates_on_these_features():
    x = ref.centred(make_features()[1])
    s = np.linalg.svd(x, compute_uv=False)
    assert np.searchsorted(np.cumsum(s**2) / np.sum(s**2), 0.99) + 1 < D  # the test exercises the reduction


@pytest.mark.parametrize("name", [name for name in MEASURES if name != "effective_rank"])
def test_streamed_measure_equals_reference(name):
    features = make_features()
    values = streamed(features, alpha=0.3, svcca_variance=0.95)[name].numpy()
    expected = reference(features, features, name, alpha=0.3, variance=0.95)
    off_diagonal = ~np.eye(L, dtype=bool)
    np.testing.assert_allclose(values[off_diagonal], expected[off_diagonal], rtol=0, atol=ATOL)
    # a layer against itself: exact here (0 or 1); the reference's sqrt / arccos of 1 - 1e-16 is off by up to 2e-8
    np.testing.assert_allclose(np.diag(values), np.diag(expected), rtol=0, atol=3e-8)
    np.testing.assert_array_equal(np.diag(values), 0.0 if name in ("procrustes", "shape") else 1.0)
    assert np.ptp(values) > 0.05  # not a constant matrix


@pytest.mark.parametrize("spectrum", ["singular", "covariance"])
def test_effective_rank_equals_reference(spectrum):
    features = make_features()
    values = streamed(features, spectrum=spectrum)["effective_rank"].numpy()
    np.testing.assert_allclose(values, [ref.effective_rank(x, spectrum) for x in features], rtol=0, atol=ATOL)
    assert 1.0 < values.min() and values.max() < D


def test_functional_equals_metric():
    features = make_features(seed=3)
    direct = similarity_measures(torch.from_numpy(features))
    for name, value in streamed(features).items():
        torch.testing.assert_close(direct[name], value, rtol=0, atol=ATOL)


def test_debiased_cka_unchanged_by_offset_and_orthogonal_map():
    features = make_features(seed=1, offset=0.0)
    q, _ = np.linalg.qr(np.random.default_rng(5).standard_normal((D, D)))
    moved = features @ q * 3.0 + 1e4
    # PWCCA's weights are on the neurons: a rotation changes them, an offset does not. The shape metric with
    # 0 < alpha < 1 mixes lambda and lambda^(-1/2): unchanged by a rotation, not by a scale (netrep's, too).
    moved_for = {"pwcca": features + 1e4, "shape": features @ q + 1e4}
    for name in ("debiased_cka", "cca", "svcca", "procrustes", "shape", "pwcca", "effective_rank"):
        values = streamed(moved_for.get(name, moved))[name]
        np.testing.assert_allclose(values, streamed(features)[name], rtol=0, atol=1e-9, err_msg=name)
    assert not np.allclose(streamed(features * 3.0)["shape"], streamed(features)["shape"], atol=1e-3)


def test_cca_unchanged_by_invertible_map_and_shape_alpha_ends():
    features = make_features(seed=2)
    mixed = features @ np.random.default_rng(7).standard_normal((D, D))
    values = streamed(features, alpha=0.0)
    np.testing.assert_allclose(streamed(mixed)["cca"], values["cca"], rtol=0, atol=1e-9)
    # netrep: alpha = 0 is arccos of the mean canonical correlation; alpha = 1 the angular Procrustes distance
    np.testing.assert_allclose(values["shape"], np.arccos(np.clip(values["cca"].numpy(), -1, 1)), atol=1e-7)
    nuclear = 1 - streamed(features)["procrustes"].numpy() ** 2 / 2
    np.testing.assert_allclose(streamed(features, alpha=1.0)["shape"], np.arccos(np.clip(nuclear, -1, 1)), atol=1e-7)


@pytest.mark.parametrize("name", ["procrustes", "shape"])
def test_triangle_inequality(name):
    """Procrustes and netrep's shape metric are metrics: d(x, z) <= d(x, y) + d(y, z) on random representations."""
    g = np.random.default_rng(11)
    stack = np.stack([g.standard_normal((60, 5)) @ g.standard_normal((5, 5)) * g.uniform(0.1, 3) for _ in range(7)])
    stack[3] = stack[2] @ np.linalg.qr(g.standard_normal((5, 5)))[0] + 0.05 * g.standard_normal((60, 5))
    for alpha in (0.0, 0.5, 1.0) if name == "shape" else (None,):
        distance = similarity_measures(torch.from_numpy(stack), [name], alpha=alpha or 0.5)[name].numpy()
        np.testing.assert_allclose(distance, distance.T, atol=1e-10)
        for i, j, k in itertools.permutations(range(7), 3):
            assert distance[i, k] <= distance[i, j] + distance[j, k] + 1e-12, (alpha, i, j, k)


def test_cross_model_measures_equal_reference():
    a = make_features(layers=3, dim=D, seed=4)
    b = make_features(layers=2, dim=4, seed=5, offset=-20.0) + 0.3 * a[:2, :, :4]
    metric = CrossModelCKA(3, D, 2, 4)
    for start, stop in ((0, 13), (13, 14), (14, N)):
        metric.update(torch.from_numpy(a[:, start:stop]), torch.from_numpy(b[:, start:stop]))
    names = [name for name in MEASURES if name != "debiased_cka"]
    values = metric.compute_measures(names, alpha=0.4)
    for name in names:
        if name == "effective_rank":
            for side, feats in (("a", a), ("b", b)):
                expected = [ref.effective_rank(x) for x in feats]
                np.testing.assert_allclose(values[f"effective_rank_{side}"], expected, rtol=0, atol=ATOL)
            continue
        np.testing.assert_allclose(values[name], reference(a, b, name, alpha=0.4), rtol=0, atol=ATOL, err_msg=name)


def test_options_named_in_errors():
    with pytest.raises(ValueError, match="`measures` 'cka2'"):
        check_measures(["cca", "cka2"])
    metric = LayerCKA(2, 3)
    metric.update(torch.randn(2, 8, 3))
    with pytest.raises(ValueError, match="debiased=True"):
        metric.compute_measures(["debiased_cka"])
    with pytest.raises(ValueError, match="svcca_variance"):
        metric.compute_measures(["svcca"], svcca_variance=1.5)
    with pytest.raises(ValueError, match="shape_alpha"):
        metric.compute_measures(["shape"], alpha=-0.1)
