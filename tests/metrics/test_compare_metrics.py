"""CKA across two models (exact and unbiased minibatch) and the arccos distance, against numpy float64."""

import numpy as np
import pytest
import torch

from layerwise.metrics.compare import CrossModelCKA, MinibatchCrossCKA
from layerwise.metrics.functional_compare import arccos_distance, chunk_hsic, cross_cka, minibatch_cross_cka

N, LA, DA, LB, DB = 90, 3, 7, 4, 5


def features(seed: int, layers: int, dim: int, n: int = N, shared: torch.Tensor = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = shared if shared is not None else torch.randn(n, 6, generator=g, dtype=torch.float64)
    out = [base @ torch.randn(6, dim, generator=g, dtype=torch.float64) for _ in range(layers)]
    return torch.stack([h + 0.8 * torch.randn(n, dim, generator=g, dtype=torch.float64) for h in out])


def pair(offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    shared = torch.randn(N, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return features(1, LA, DA, shared=shared) + offset, features(2, LB, DB, shared=shared) - offset


def ref_cka(x: np.ndarray, y: np.ndarray) -> float:
    """CKA from explicitly centred Gram matrices, tr(K H L H) / sqrt(...)."""
    n = x.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    k, l = h @ (x @ x.T) @ h, h @ (y @ y.T) @ h  # noqa: E741
    return float(np.trace(k @ l) / np.sqrt(np.trace(k @ k) * np.trace(l @ l)))


def ref_hsic_u(x: np.ndarray, y: np.ndarray) -> float:
    """HSIC_1 as the inner product of U-centred Grams (Song et al., 2012), a different route from the formula."""

    def u_centre(m: np.ndarray) -> np.ndarray:
        n = m.shape[0]
        m = m.copy()
        np.fill_diagonal(m, 0.0)
        out = m - m.sum(1, keepdims=True) / (n - 2) - m.sum(0, keepdims=True) / (n - 2) + m.sum() / ((n - 1) * (n - 2))
        np.fill_diagonal(out, 0.0)
        return out

    n = x.shape[0]
    xc, yc = x - x.mean(0), y - y.mean(0)
    return float((u_centre(xc @ xc.T) * u_centre(yc @ yc.T)).sum() / (n * (n - 3)))


def random_orthogonal(dim: int, seed: int) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return q


@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_exact_cross_cka_matches_numpy_with_different_widths_and_offsets(offset):
    a, b = pair(offset)
    metric = CrossModelCKA(LA, DA, LB, DB)
    for start, stop in ((0, 31), (31, 32), (32, N)):  # uneven batches, one of a single token
        metric.update(a[:, start:stop].float() if offset == 0 else a[:, start:stop], b[:, start:stop])
    a32 = a.float().double() if offset == 0 else a
    expected = np.array([[ref_cka(a32[i].numpy(), b[j].numpy()) for j in range(LB)] for i in range(LA)])
    np.testing.assert_allclose(metric.compute().numpy(), expected, rtol=0, atol=1e-9)
    np.testing.assert_allclose(
        cross_cka(a, b).numpy(),
        [[ref_cka(a[i].numpy(), b[j].numpy()) for j in range(LB)] for i in range(LA)],
        rtol=0,
        atol=1e-9,
    )


@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_diagonal_pairs_equal_the_diagonal_of_all_pairs(offset):
    """pairs='diagonal' (the arccos distance's pairs only): numpy's CKA(i, i), NaN elsewhere, the same distance."""
    shared = torch.randn(N, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a, b = features(1, LA, DA, shared=shared) + offset, features(2, LA, DB, shared=shared) - offset  # equal depth
    diagonal, full = CrossModelCKA(LA, DA, LA, DB, pairs="diagonal"), CrossModelCKA(LA, DA, LA, DB)
    for start, stop in ((0, 31), (31, 32), (32, N)):
        diagonal.update(a[:, start:stop], b[:, start:stop])
        full.update(a[:, start:stop], b[:, start:stop])
    assert diagonal.cross.shape == (LA, DA, DB)
    value = diagonal.compute()
    expected = [ref_cka(a[i].numpy(), b[i].numpy()) for i in range(LA)]
    np.testing.assert_allclose(value.diagonal().numpy(), expected, rtol=0, atol=1e-9)
    assert torch.isnan(value[~torch.eye(LA, dtype=torch.bool)]).all()
    torch.testing.assert_close(arccos_distance(value), arccos_distance(full.compute()), rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match="equal depth"):
        CrossModelCKA(LA, DA, LB, DB, pairs="diagonal")


def test_diagonal_pairs_merge_at_large_offsets():
    shared = torch.randn(N, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a, b = features(1, LA, DA, shared=shared) + 1e6, features(2, LA, DB, shared=shared) - 1e6
    whole, first, second = (CrossModelCKA(LA, DA, LA, DB, pairs="diagonal") for _ in range(3))
    whole.update(a, b)
    first.update(a[:, :40], b[:, :40])
    second.update(a[:, 40:], b[:, 40:])
    first.merge_state(second)
    torch.testing.assert_close(first.compute(), whole.compute(), rtol=0, atol=1e-9, equal_nan=True)
    torch.testing.assert_close(whole.compute().diagonal(), cross_cka(a - 1e6, b + 1e6).diagonal(), rtol=0, atol=1e-9)


def test_cross_cka_identity_and_invariances():
    a, b = pair()
    torch.testing.assert_close(cross_cka(a, a).diagonal(), torch.ones(LA, dtype=torch.float64))
    rotated = 4.2 * a @ random_orthogonal(DA, 3)  # an orthogonal map and an isotropic scale of model A's features
    torch.testing.assert_close(cross_cka(rotated, b), cross_cka(a, b), rtol=0, atol=1e-12)
    torch.testing.assert_close(cross_cka(a, 0.3 * b @ random_orthogonal(DB, 4)), cross_cka(a, b), rtol=0, atol=1e-12)


def test_merged_shifted_states_equal_one_pass():
    a, b = pair(1e6)
    whole, first, second = (CrossModelCKA(LA, DA, LB, DB) for _ in range(3))
    whole.update(a, b)
    first.update(a[:, :40], b[:, :40])
    second.update(a[:, 40:], b[:, 40:])
    first.merge_state(second)
    torch.testing.assert_close(first.compute(), whole.compute(), rtol=0, atol=1e-9)
    torch.testing.assert_close(whole.compute(), cross_cka(a - 1e6, b + 1e6), rtol=0, atol=1e-9)


def test_unbiased_hsic_equals_the_u_centred_form():
    a, b = pair()
    across, self_a, self_b = chunk_hsic(a[:, :40], b[:, :40])
    for i in range(LA):
        assert self_a[i].item() == pytest.approx(ref_hsic_u(a[i, :40].numpy(), a[i, :40].numpy()), rel=1e-9)
        for j in range(LB):
            assert across[i, j].item() == pytest.approx(ref_hsic_u(a[i, :40].numpy(), b[j, :40].numpy()), rel=1e-9)
    for j in range(LB):
        assert self_b[j].item() == pytest.approx(ref_hsic_u(b[j, :40].numpy(), b[j, :40].numpy()), rel=1e-9)


def test_minibatch_aggregations_and_the_streaming_metric():
    a, b = pair()
    one = minibatch_cross_cka(a, b, chunk=N, aggregation="mean")
    torch.testing.assert_close(minibatch_cross_cka(a, b, chunk=N, aggregation="sum"), one)  # one chunk: (b) = (a)
    metric = MinibatchCrossCKA(LA, LB, chunk=25)
    for start in range(0, N, 13):  # batches that do not line up with the chunks
        metric.update(a[:, start : start + 13], b[:, start : start + 13])
    out = metric.compute()
    torch.testing.assert_close(out["mean"], minibatch_cross_cka(a, b, chunk=25, aggregation="mean"))
    torch.testing.assert_close(out["sum"], minibatch_cross_cka(a, b, chunk=25, aggregation="sum"))
    assert int(metric.num_chunks) == 3  # 90 tokens: 3 full chunks of 25, the last 15 counted at compute only
    assert not torch.allclose(out["mean"], out["sum"])


def test_arccos_distance_is_a_metric():
    layers, dim = 3, 6
    shared = torch.randn(60, 6, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    models = [features(seed, layers, dim, n=60, shared=shared) for seed in range(10, 16)]

    def distance(x, y):
        diagonal = torch.stack(
            [minibatch_cross_cka(x[i : i + 1], y[i : i + 1], chunk=20, aggregation="sum")[0, 0] for i in range(layers)]
        )
        return arccos_distance(torch.diag(diagonal)).item()

    assert distance(models[0], models[0]) == pytest.approx(0.0, abs=1e-6)
    for x, y, z in ((0, 1, 2), (3, 4, 5), (1, 3, 5), (2, 0, 4)):
        dxy, dyx = distance(models[x], models[y]), distance(models[y], models[x])
        assert dxy == pytest.approx(dyx, rel=1e-12) and dxy > 0
        assert distance(models[x], models[z]) <= dxy + distance(models[y], models[z]) + 1e-12
    with pytest.raises(ValueError, match="equal depth"):
        arccos_distance(torch.zeros(2, 3))
