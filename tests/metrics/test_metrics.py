"""Layer-wise metrics against independent float64 numpy references, plus their invariances."""

import numpy as np
import pytest
import torch
from helpers import ref_unbiased_hsic

from layerwise.metrics import (
    EarlyExit,
    LayerAccuracy,
    LayerCKA,
    LayerCosineSimilarity,
    LayerNC1,
    MinibatchCKA,
    SaturationCosine,
    SaturationHistogram,
    all_reduce_sum_states,
    effective_depth,
    linear_cka,
    nc1,
    saturation_layers,
)
from layerwise.metrics.functional_distribution import histogram_quantiles

N, L, D, C = 37, 4, 6, 5
SPLITS = (7, 13, 1, 16)  # uneven, with a batch of one


# ---------------------------------------------------------------------------------------------------------- data
def make_features(seed: int, n: int = N, layers: int = L, dim: int = D, mean: float = 0.0) -> torch.Tensor:
    """Correlated float32 layers: every layer is a random linear map of a shared signal plus noise."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, dim, generator=g, dtype=torch.float64)
    out = [base @ torch.randn(dim, dim, generator=g, dtype=torch.float64) / dim**0.5 for _ in range(layers)]
    out = [h + 0.7 * torch.randn(n, dim, generator=g, dtype=torch.float64) for h in out]
    return (mean + torch.stack(out)).to(torch.float32)


def make_logits(seed: int, n: int = N, layers: int = L, classes: int = C) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits whose evidence for the target grows with depth, and the targets."""
    g = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, classes, (n,), generator=g)
    logits = 2.0 * torch.randn(layers, n, classes, generator=g)
    logits += torch.linspace(0.0, 4.0, layers).view(-1, 1, 1) * torch.nn.functional.one_hot(targets, classes)
    return logits, targets


def batches(*tensors: torch.Tensor, splits=SPLITS, dims=None):
    """Yield the tensors cut into uneven batches along their sample dimension (1 for (L, B, ...), 0 for (B,))."""
    dims = dims or [1 if t.ndim >= 2 else 0 for t in tensors]
    start = 0
    for size in splits:
        yield tuple(t.narrow(dim, start, size) for t, dim in zip(tensors, dims))
        start += size
    assert start == tensors[0].shape[dims[0]]


def np64(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.float64).numpy()


# ---------------------------------------------------------------------------------------------------- references
def ref_cos(h: np.ndarray, center: bool) -> np.ndarray:
    x = h - h.mean(axis=1, keepdims=True) if center else h
    out = np.zeros((h.shape[0], h.shape[0]))
    for a in range(h.shape[0]):
        for b in range(h.shape[0]):
            cos = [x[a, i] @ x[b, i] / (np.linalg.norm(x[a, i]) * np.linalg.norm(x[b, i])) for i in range(h.shape[1])]
            out[a, b] = np.mean(cos)
    return out


def ref_cka(h: np.ndarray) -> np.ndarray:
    """CKA from HSIC of explicitly centred Gram matrices, tr(K H L H)."""
    n = h.shape[1]
    centering = np.eye(n) - np.ones((n, n)) / n
    grams = [centering @ (x @ x.T) @ centering for x in h]
    hsic = np.array([[np.trace(ka @ kb) for kb in grams] for ka in grams])
    return hsic / np.sqrt(np.outer(np.diag(hsic), np.diag(hsic)))


def ref_nc1(h: np.ndarray, y: np.ndarray) -> float:
    classes = np.unique(y)
    means = np.stack([h[y == k].mean(axis=0) for k in classes])
    centred = h - means[np.searchsorted(classes, y)]
    sigma_w = centred.T @ centred / len(h)
    between = means - means.mean(axis=0)
    sigma_b = between.T @ between / len(classes)
    # Sigma_B has rank <= K - 1: its true non-zero eigenvalues are O(1), the null ones O(1e-16).
    return float(np.trace(sigma_w @ np.linalg.pinv(sigma_b, rcond=1e-10, hermitian=True)) / len(classes))


def ref_saturation(preds: np.ndarray) -> np.ndarray:
    out = []
    for i in range(preds.shape[1]):
        layer = preds.shape[0] - 1
        while layer > 0 and preds[layer - 1, i] == preds[-1, i]:
            layer -= 1
        out.append(layer)
    return np.array(out)


def ref_early_exit(logits: np.ndarray, targets: np.ndarray, thresholds, numbers, depth):
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = z / z.sum(axis=-1, keepdims=True)
    acc, counts, speed = [], [], []
    for tau in thresholds:
        correct, exits = 0, np.zeros(logits.shape[0])
        for i in range(logits.shape[1]):
            layer = next((j for j in range(logits.shape[0]) if probs[j, i].max() >= tau), logits.shape[0] - 1)
            exits[layer] += 1
            correct += int(probs[layer, i].argmax() == targets[i])
        acc.append(correct / logits.shape[1])
        counts.append(exits)
        speed.append(depth * exits.sum() / (exits * np.asarray(numbers)).sum())
    return np.array(acc), np.array(counts), np.array(speed)


def random_orthogonal(dim: int, seed: int) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return q


# ------------------------------------------------------------------------------------------------------------ COS
@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize("mean", [0.0, 1e3])
def test_cosine_matches_loop_reference(center, mean):
    h = make_features(0, mean=mean)
    metric = LayerCosineSimilarity(L, center=center)
    for (x,) in batches(h):
        metric.update(x)
    out = metric.compute()
    assert out.dtype == torch.float64 and out.shape == (L, L)
    np.testing.assert_allclose(out.numpy(), ref_cos(np64(h), center), rtol=0, atol=1e-10)


def ref_cos_samples(h: np.ndarray, center: bool) -> np.ndarray:
    """The per-sample cosines (L, L, N) of the COS matrix, by a loop."""
    x = h - h.mean(axis=1, keepdims=True) if center else h
    layers, n = h.shape[:2]
    out = np.zeros((layers, layers, n))
    for a in range(layers):
        for b in range(layers):
            for i in range(n):
                out[a, b, i] = x[a, i] @ x[b, i] / (np.linalg.norm(x[a, i]) * np.linalg.norm(x[b, i]))
    return out


@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize("bins", [400, 7])
def test_cosine_distribution_matches_numpy(center, bins):
    h = make_features(5, n=300, mean=0.3)
    metric = LayerCosineSimilarity(L, center=center, bins=bins)
    for (x,) in batches(h, splits=(100, 1, 150, 49)):
        metric.update(x)
    mean, histogram, negative = metric.compute_distribution()
    cosines = ref_cos_samples(np64(h), center)
    np.testing.assert_allclose(mean.numpy(), cosines.mean(-1), rtol=0, atol=1e-10)
    np.testing.assert_allclose(negative.numpy(), (cosines < 0).mean(-1), rtol=0, atol=1e-12)
    assert negative[0, -1] > 0.01  # the far-apart layers of this data do have negative samples
    off_diagonal = ~np.eye(L, dtype=bool)  # the diagonal is 1 +- 1 ulp, at the edge
    expected = np.stack([np.histogram(c, bins=bins, range=(-1, 1))[0] for c in cosines[off_diagonal]])
    np.testing.assert_array_equal(histogram.numpy()[off_diagonal], expected)
    assert histogram.sum(-1).eq(300).all()
    quantiles = (0.0, 0.01, 0.25, 0.5, 0.75, 0.99, 1.0)
    estimate = histogram_quantiles(histogram, quantiles, -1.0, 1.0).numpy()
    exact = np.moveaxis(np.quantile(cosines, quantiles, axis=-1), 0, -1)
    assert np.abs(estimate - exact).max() <= 1.0 / bins + 1e-12  # half the bin width 2 / bins
    if bins == 7:  # a coarse histogram is really off by up to half a bin: the bound is not vacuous
        assert np.abs(estimate - exact).max() > 0.2 / bins


def test_histogram_quantiles_edge_cases():
    empty = torch.zeros(2, 5)
    assert histogram_quantiles(empty, (0.5,), 0.0, 1.0).isnan().all()
    one = torch.zeros(5)
    one[3] = 1  # one value in [0.6, 0.8)
    torch.testing.assert_close(histogram_quantiles(one, (0.0, 0.5, 1.0), 0.0, 1.0), torch.full((3,), 0.7).double())
    with pytest.raises(ValueError, match="Quantiles must lie in"):
        histogram_quantiles(one, (1.5,), 0.0, 1.0)
    with pytest.raises(ValueError, match="`bins`"):
        LayerCosineSimilarity(L, bins=-1)
    with pytest.raises(ValueError, match="construct the metric with `bins`"):
        LayerCosineSimilarity(L).compute_distribution()


def test_cosine_bf16_input():
    h = make_features(1).to(torch.bfloat16)
    metric = LayerCosineSimilarity(L, dim=D)
    for (x,) in batches(h):
        metric.update(x)
    np.testing.assert_allclose(metric.compute().numpy(), ref_cos(np64(h), True), rtol=0, atol=1e-10)


def test_cosine_changes_under_rotation_of_one_layer():
    h = make_features(2)
    rotated = h.clone()
    rotated[1] = (h[1].double() @ random_orthogonal(D, 3)).float()
    cos = [LayerCosineSimilarity(L)(x) for x in (h, rotated)]
    assert (cos[0][0, 1] - cos[1][0, 1]).abs() > 1e-2
    torch.testing.assert_close(cos[0][2:, 2:], cos[1][2:, 2:], rtol=0, atol=1e-12)


def test_centered_cosine_fallback_warns_and_approximates():
    h = make_features(4, mean=0.5)
    exact, approx = LayerCosineSimilarity(L), LayerCosineSimilarity(L, max_buffered_samples=10)
    with pytest.warns(UserWarning, match="max_buffered_samples"):
        for (x,) in batches(h):
            exact.update(x)
            approx.update(x)
    assert approx._num_buffered == 0 and not approx._buffer  # the buffer was folded and freed
    out, ref = approx.compute(), exact.compute()
    assert out.abs().max() <= 1 + 1e-12
    assert 1e-6 < (out - ref).abs().max() < 0.1  # approximate, yet close


def test_saturation_cosine_fallback_warns_and_approximates():
    h, (logits, _) = make_features(5, mean=0.5), make_logits(5)
    saturation = saturation_layers(logits.argmax(-1))
    exact, approx = SaturationCosine(L), SaturationCosine(L, max_buffered_samples=15)
    with pytest.warns(UserWarning, match="max_buffered_samples"):
        for x, s in batches(h, saturation):
            exact.update(x, s)
            approx.update(x, s)
    out, ref = approx.compute(), exact.compute()
    assert torch.equal(out.isnan(), ref.isnan())
    diff = (out - ref).nan_to_num().abs().max()
    assert 1e-6 < diff < 0.1


def test_centered_cosine_forward_returns_batch_value_and_accumulates():
    h = make_features(6)
    metric = LayerCosineSimilarity(L)
    for (x,) in batches(h):
        batch_value = metric(x)
        if x.shape[1] > 1:
            np.testing.assert_allclose(batch_value.numpy(), ref_cos(np64(x), True), atol=1e-10)
    np.testing.assert_allclose(metric.compute().numpy(), ref_cos(np64(h), True), atol=1e-10)
    metric.reset()
    assert not metric._buffer and (metric.count == 0).all()


@pytest.mark.parametrize("chunk_samples", [1, 2, 60, 10_000])
def test_centred_buffers_give_the_same_result_whatever_their_chunking(monkeypatch, chunk_samples):
    """compute joins the buffered batches into chunks (a few passes instead of one per batch): the chunk size,
    from one batch per pass (smaller than a batch) to all at once, changes no histogram count and no mean beyond
    rounding, for both centred metrics."""
    h, (logits, _) = make_features(11, n=300, mean=50.0), make_logits(11, n=300)
    saturation = saturation_layers(logits.argmax(-1))
    results = {}
    for chunk_bytes in (8 * L * D * chunk_samples, None):
        if chunk_bytes is not None:
            monkeypatch.setattr(LayerCosineSimilarity, "_CHUNK_BYTES", chunk_bytes)
            monkeypatch.setattr(SaturationCosine, "_CHUNK_BYTES", 8 * D * chunk_samples)
        else:
            monkeypatch.undo()
        cos, sat = LayerCosineSimilarity(L, bins=40), SaturationCosine(L)
        for x, s in batches(h, saturation, splits=(100, 1, 150, 49)):
            cos.update(x)
            sat.update(x, s)
        results[chunk_bytes is None] = (*cos.compute_distribution(), sat.compute())
    (mean, histogram, negative, saturation_cos), default = results[False], results[True]
    torch.testing.assert_close(histogram, default[1], rtol=0, atol=0)
    torch.testing.assert_close(negative, default[2], rtol=0, atol=0)
    torch.testing.assert_close(mean, default[0], rtol=0, atol=1e-13)
    torch.testing.assert_close(saturation_cos, default[3], rtol=0, atol=1e-13, equal_nan=True)
    np.testing.assert_allclose(mean.numpy(), ref_cos(np64(h), True), rtol=0, atol=1e-10)


# ----------------------------------------------------------------------------------------------- saturation COS
@pytest.mark.parametrize("center", [True, False])
def test_saturation_cosine_matches_loop_reference(center):
    h, (logits, _) = make_features(7, mean=3.0), make_logits(7)
    saturation = saturation_layers(logits.argmax(-1))
    metric = SaturationCosine(L, center=center)
    for x, s in batches(h, saturation):
        metric.update(x, s)
    out = metric.compute()
    x = np64(h) - np64(h).mean(axis=1, keepdims=True) if center else np64(h)
    for layer in range(L):
        idx = [i for i in range(N) if saturation[i] == layer]
        cos = [x[layer, i] @ x[-1, i] / (np.linalg.norm(x[layer, i]) * np.linalg.norm(x[-1, i])) for i in idx]
        expected = np.mean(cos) if idx else np.nan
        np.testing.assert_allclose(out[layer].item(), expected, rtol=0, atol=1e-10, equal_nan=True)
    assert out[-1] == pytest.approx(1.0) and out.isnan().any() == (len(saturation.unique()) < L)


# ------------------------------------------------------------------------------------------------------------ CKA
@pytest.mark.parametrize("mean", [0.0, 1e3])
def test_cka_matches_centred_gram_reference(mean):
    h = make_features(8, mean=mean)
    metric = LayerCKA(L, D)
    for (x,) in batches(h):
        metric.update(x)
    out = metric.compute()
    assert out.dtype == torch.float64 and out.shape == (L, L)
    np.testing.assert_allclose(out.numpy(), ref_cka(np64(h)), rtol=0, atol=1e-8 if mean else 1e-10)


def test_cka_float32_raw_moments_would_fail_for_large_mean():
    """The same sufficient statistics in float32 are far off for mean 1e3, std 1: float64 is not optional."""
    h = make_features(9, mean=1e3)
    z = h.transpose(0, 1).reshape(N, L * D)
    mu = z.mean(0)
    k = (z.T @ z - N * torch.outer(mu, mu)).reshape(L, D, L, D)
    frob = k.square().sum(dim=(1, 3))
    naive = frob / torch.sqrt(torch.outer(frob.diagonal(), frob.diagonal()))
    ref = ref_cka(np64(h))
    assert np.abs(naive.double().numpy() - ref).max() > 0.01  # 0.08 for this seed
    np.testing.assert_allclose(linear_cka(h).numpy(), ref, rtol=0, atol=1e-8)  # 1e-10 for this seed


def test_cka_invariant_to_orthogonal_map_and_isotropic_scaling():
    h = make_features(10)
    transformed = h.clone()
    transformed[2] = (3.7 * h[2].double() @ random_orthogonal(D, 11)).float()
    torch.testing.assert_close(linear_cka(transformed), linear_cka(h), rtol=0, atol=1e-6)  # float32 storage of x
    assert not torch.allclose(transformed[2], h[2])


def test_cka_bf16_input():
    h = make_features(12).to(torch.bfloat16)
    metric = LayerCKA(L, D)
    for (x,) in batches(h):
        metric.update(x)
    np.testing.assert_allclose(metric.compute().numpy(), ref_cka(np64(h)), rtol=0, atol=1e-10)


def test_minibatch_cka_matches_per_batch_formula():
    h = make_features(13, mean=2.0)
    splits = (8, 3, 13, 13)  # the batch of 3 is skipped
    metric = MinibatchCKA(L)
    with pytest.warns(UserWarning, match="fewer than 4"):
        for (x,) in batches(h, splits=splits):
            metric.update(x)
    hsic = np.zeros((L, L))
    for (x,) in batches(h, splits=splits):
        if x.shape[1] >= 4:
            xs = np64(x)
            hsic += np.array([[ref_unbiased_hsic(xs[a], xs[b]) for b in range(L)] for a in range(L)])
    expected = hsic / np.sqrt(np.outer(np.diag(hsic), np.diag(hsic)))
    np.testing.assert_allclose(metric.compute().numpy(), expected, rtol=0, atol=1e-10)
    assert metric.num_batches == 3


def test_minibatch_cka_approaches_exact_cka_for_large_batches():
    n = 4000
    h = make_features(14, n=n, layers=3, dim=8)
    metric = MinibatchCKA(3)
    for (x,) in batches(h, splits=(1000,) * 4):
        metric.update(x)
    exact = linear_cka(h)
    assert exact.min() < 0.8  # the layers are not trivially similar
    torch.testing.assert_close(metric.compute(), exact, rtol=0, atol=0.03)


# ---------------------------------------------------------------------------------------------- prediction metrics
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_accuracy_matches_reference(dtype):
    logits, targets = make_logits(15)
    logits = logits.to(dtype)
    metric = LayerAccuracy(L)
    for lg, t in batches(logits, targets):
        metric.update(lg, t)
    out = metric.compute()
    x = np64(logits)
    log_probs = x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
    expected_loss = -np.array([[log_probs[j, i, targets[i]] for i in range(N)] for j in range(L)]).mean(1)
    expected_acc = np.array([[x[j, i].argmax() == targets[i] for i in range(N)] for j in range(L)]).mean(1)
    np.testing.assert_array_equal(out["accuracy"].numpy(), expected_acc)
    np.testing.assert_allclose(out["loss"].numpy(), expected_loss, rtol=1e-12)


def test_lens_statistics_match_reference_through_the_chunked_readout():
    """KL(p_L || p_l), entropy and the 1-based rank of the last layer's top-1, each from a loop over the definitions;
    the rows come from the one readout in chunks smaller than a batch (a linear head per layer)."""
    from layerwise.engines.readout import chunked_readout
    from layerwise.metrics import LensStatistics

    g = torch.Generator().manual_seed(18)
    features = torch.randn(L, N, 6, generator=g, dtype=torch.float64)
    weights = [torch.randn(9, 6, generator=g, dtype=torch.float64) for _ in range(L)]
    heads = [lambda h, w=w: h @ w.T for w in weights]
    metric = LensStatistics(L)
    for start in range(0, N, 7):
        metric.update(chunked_readout(heads, features[:, start : start + 7], chunk_size=3, reference=True))
    out = metric.compute()
    logits = [np64(features[j]) @ np64(weights[j]).T for j in range(L)]
    probs = [
        np.exp(z - z.max(-1, keepdims=True)) / np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)
        for z in logits
    ]
    final = probs[-1]
    kl = [
        np.mean([sum(final[i, c] * np.log(final[i, c] / p[i, c]) for c in range(9)) for i in range(N)]) for p in probs
    ]
    entropy = [np.mean([-sum(p[i, c] * np.log(p[i, c]) for c in range(9)) for i in range(N)]) for p in probs]
    rank = [np.mean([1 + sum(p[i, c] > p[i, final[i].argmax()] for c in range(9)) for i in range(N)]) for p in probs]
    np.testing.assert_allclose(out["kl_to_final"].numpy(), kl, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out["entropy"].numpy(), entropy, rtol=1e-10)
    np.testing.assert_allclose(out["final_rank"].numpy(), rank, rtol=0)
    assert out["kl_to_final"][-1] == 0 and out["final_rank"][-1] == 1 and out["final_rank"][0] > 1


def test_saturation_layers_and_histogram_match_loop():
    g = torch.Generator().manual_seed(16)
    preds = torch.randint(0, 3, (5, 200), generator=g)
    np.testing.assert_array_equal(saturation_layers(preds).numpy(), ref_saturation(preds.numpy()))
    logits, _ = make_logits(17)
    metric = SaturationHistogram(L)
    for (lg,) in batches(logits):
        metric.update(lg)
    expected = np.bincount(ref_saturation(logits.argmax(-1).numpy()), minlength=L)
    np.testing.assert_array_equal(metric.compute().numpy(), expected)


@pytest.mark.parametrize(("numbers", "depth"), [(None, None), ((3, 6, 9, 12), 12), ((2, 4, 6, 8), 10)])
def test_early_exit_matches_loop(numbers, depth):
    logits, targets = make_logits(18)
    thresholds = (0.0, 0.3, 0.5, 0.9, 0.999, 1.0)
    metric = EarlyExit(L, thresholds, layer_numbers=numbers, depth=depth)
    for lg, t in batches(logits, targets):
        metric.update(lg, t)
    out = metric.compute()
    numbers = numbers or tuple(range(1, L + 1))
    acc, counts, speed = ref_early_exit(np64(logits), targets.numpy(), thresholds, numbers, depth or max(numbers))
    np.testing.assert_array_equal(out["accuracy"].numpy(), acc)
    np.testing.assert_array_equal(out["exit_counts"].numpy(), counts)
    np.testing.assert_allclose(out["speedup"].numpy(), speed, rtol=1e-12)
    assert out["speedup"][0] == (depth or max(numbers)) / numbers[0]  # tau = 0: everyone exits at row 0


# ----------------------------------------------------------------------------------------------------------- NC1
@pytest.mark.parametrize(("dim", "classes"), [(6, 4), (3, 7)])  # rank-deficient Sigma_B, and full-rank
def test_nc1_matches_pinv_reference(dim, classes):
    h = make_features(19, n=60, dim=dim)
    targets = torch.randint(0, classes, (60,), generator=torch.Generator().manual_seed(19))
    targets[targets == 1] = 0  # class 1 absent: excluded from K
    h += 2.0 * torch.randn(classes, dim, generator=torch.Generator().manual_seed(20))[targets]
    metric = LayerNC1(L, dim, classes + 2)  # two more classes that never occur
    for x, t in batches(h, targets, splits=(20, 1, 39)):
        metric.update(x, t)
    out = metric.compute()
    expected = [ref_nc1(np64(h)[layer], targets.numpy()) for layer in range(L)]
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-8)
    assert (out > 0).all()


@pytest.mark.parametrize(("dim", "classes"), [(40, 10), (8, 30)])  # A^T A (K x K) and A A^T (d x d)
@pytest.mark.parametrize("spread", [0.1, 1e-5])  # well determined (eigh), and a 1e5 range (the SVD)
def test_nc1_left_singular_pairs_equal_numpy_svd(monkeypatch, dim, classes, spread):
    from layerwise.metrics import functional_collapse as functional

    g = torch.Generator().manual_seed(23)
    a = torch.randn(L, dim, classes, generator=g, dtype=torch.float64)
    a = a - a.mean(dim=2, keepdim=True)  # centred columns: rank min(d, K - 1)
    rank = min(dim, classes - 1)
    left, _, right = torch.linalg.svd(a, full_matrices=False)
    values = torch.logspace(0, np.log10(spread), rank, dtype=torch.float64)  # from 1 down to `spread`
    a = left[..., :rank] @ torch.diag(values) @ right[..., :rank, :]
    svd_calls = []
    svd = torch.linalg.svd
    monkeypatch.setattr(torch.linalg, "svd", lambda *args, **kw: svd_calls.append(1) or svd(*args, **kw))
    u, s = functional._left_singular(a)
    assert bool(svd_calls) == (spread < 1e-3)
    for layer in range(L):
        ref_u, ref_s, _ = np.linalg.svd(a[layer].numpy(), full_matrices=False)
        np.testing.assert_allclose(s[layer, :rank].numpy(), ref_s[:rank], rtol=1e-10)
        # each direction up to sign: |<u_j, ref_u_j>| = 1
        overlap = np.abs(np.sum(u[layer, :, :rank].numpy() * ref_u[:, :rank], axis=0))
        np.testing.assert_allclose(overlap, 1.0, atol=1e-8)


def test_nc1_with_a_narrow_class_direction_matches_pinv_reference(monkeypatch):
    g = torch.Generator().manual_seed(24)
    targets = torch.arange(60) % 6
    means = torch.randn(6, 4, generator=g, dtype=torch.float64)
    h = means[targets].expand(L, -1, -1) + 0.1 * torch.randn(L, 60, 4, generator=g, dtype=torch.float64)
    wide = nc1(h, targets, 6)
    h[..., 0] *= 1e-4  # d = 4 <= K - 1: Sigma_B now spans about 1e8 in eigenvalue, the SVD path
    svd_calls = []
    svd = torch.linalg.svd
    monkeypatch.setattr(torch.linalg, "svd", lambda *args, **kw: svd_calls.append(1) or svd(*args, **kw))
    expected = [ref_nc1(h[layer].numpy(), targets.numpy()) for layer in range(L)]
    narrow = nc1(h, targets, 6)
    np.testing.assert_allclose(narrow.numpy(), expected, rtol=1e-6)
    assert svd_calls
    torch.testing.assert_close(narrow, wide, rtol=1e-8, atol=0)  # NC1 is invariant under rescaling a feature


@pytest.mark.parametrize(("spread", "path"), [(0.3, "cholesky"), (3e-3, "cholesky"), (1.5e-3, "eigh"), (1e-4, "svd")])
def test_nc1_with_more_classes_than_dimensions_takes_the_cheapest_exact_path(monkeypatch, spread, path):
    """d < K: Sigma_B has full rank and NC1 = tr(Sigma_W Sigma_B^-1), by a Cholesky factor while a sure bound on its
    condition number is below 1e6; past the bound eigh of the Gram matrix, past eigh's own range the SVD. Every
    path gives the numpy pinv reference."""
    from layerwise.metrics import functional_collapse as functional

    g = torch.Generator().manual_seed(25)
    dim, classes, n = 8, 30, 300
    targets = torch.arange(n) % classes
    left, _, right = torch.linalg.svd(torch.randn(dim, classes, generator=g, dtype=torch.float64), full_matrices=False)
    # singular values of the class means: half 1, half `spread`; the sure bound on cond(Sigma_B) is then 4 cond,
    # so that spread = 1.5e-3 (cond 4.4e5 < 1e6, bound 1.8e6) is refused by the Cholesky path and taken by eigh
    values = torch.tensor([1.0] * (dim // 2) + [spread] * (dim // 2), dtype=torch.float64)
    means = (left @ torch.diag(values) @ right).T * 10.0
    noise = 0.1 * torch.randn(L, n, dim, generator=g, dtype=torch.float64)
    noise -= noise.view(L, n // classes, classes, dim).mean(dim=1).repeat(1, n // classes, 1)  # zero in every class
    h = means[targets] + noise + 5.0  # class means exactly `means` (plus a common offset)
    calls = []
    for module, name in ((torch.linalg, "cholesky_ex"), (torch.linalg, "eigh"), (torch.linalg, "svd")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _o=original, _n=name, **k: calls.append(_n) or _o(*a, **k))
    out = functional.nc1(h, targets, classes)
    taken = {"cholesky": ["cholesky_ex"], "eigh": ["cholesky_ex", "eigh"], "svd": ["cholesky_ex", "eigh", "svd"]}
    assert calls == taken[path]
    expected = [ref_nc1(h[layer].numpy(), targets.numpy()) for layer in range(L)]
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-9 if path != "svd" else 1e-6)


def test_nc1_collapsed_features_and_large_mean():
    g = torch.Generator().manual_seed(21)
    targets = torch.randint(0, 5, (50,), generator=g)
    means = torch.randn(L, 5, 8, generator=g, dtype=torch.float64)
    collapsed = means[:, targets]
    assert nc1(collapsed, targets, 5).abs().max() < 1e-12
    noisy = collapsed + 0.3 * torch.randn(L, 50, 8, generator=g, dtype=torch.float64)
    shifted = nc1(noisy + 1e3, targets, 5)
    torch.testing.assert_close(shifted, nc1(noisy, targets, 5), rtol=1e-6, atol=0)
    assert (shifted > 0.01).all()
    assert nc1(noisy, torch.zeros(50, dtype=torch.long), 5).isnan().all()  # one class: undefined


# ------------------------------------------------------------------------------------------------ effective depth
def test_effective_depth():
    acc = torch.tensor([0.2, 0.9, 0.985, 0.995, 0.97])
    assert effective_depth(acc, [0.01, 0.02, 0.2, 0.0]) == {"0.01": 4, "0.02": 3, "0.2": 2, "0.0": 5}
    assert effective_depth(acc, [0.01, 0.1], relative=True) == {"0.01": 3, "0.1": 2}
    assert effective_depth([0.5, 0.6], [0.01], layer_numbers=[6, 12]) == {"0.01": 12}


# ---------------------------------------------------------------------------------------------- API and validation
def test_states_are_float64_sums_and_reduce_is_noop_without_ddp():
    metrics = [
        LayerCosineSimilarity(L, dim=D),
        SaturationCosine(L, center=False),
        LayerCKA(L, D),
        MinibatchCKA(L),
        LayerAccuracy(L),
        SaturationHistogram(L),
        EarlyExit(L),
        LayerNC1(L, D, C),
    ]
    parent = torch.nn.ModuleList(metrics).to(torch.bfloat16)  # e.g. Lightning "bf16-true" converting a module
    for metric in parent:
        assert metric.metric_state and all(v.dtype == torch.float64 for v in metric.metric_state.values())
    h = make_features(22)
    metrics[2].update(h)
    before = metrics[2].cross.clone()
    all_reduce_sum_states(metrics)
    assert torch.equal(metrics[2].cross, before)


@pytest.mark.parametrize(
    ("metric", "args", "match"),
    [
        (LayerCosineSimilarity(L), (torch.zeros(L + 1, 2, D),), r"\(5, 2, 6\)"),
        (LayerCKA(L, D), (torch.zeros(L, 2, D + 1),), r"\(4, 2, 7\)"),
        (MinibatchCKA(L), (torch.zeros(2, D),), r"\(2, 6\)"),
        (LayerAccuracy(L), (torch.zeros(L, 3, C), torch.zeros(4, dtype=torch.long)), r"\(4,\)"),
        (LayerAccuracy(L), (torch.zeros(L, 3, C), torch.zeros(3)), "integer"),
        (EarlyExit(L), (torch.zeros(L, 3), torch.zeros(3, dtype=torch.long)), r"\(4, 3\)"),
        (LayerNC1(L, D, C), (torch.zeros(L, 3, D), torch.zeros(3, 1, dtype=torch.long)), r"\(3, 1\)"),
        (SaturationCosine(L), (torch.zeros(L, 3, D), torch.zeros(2, dtype=torch.long)), r"\(2,\)"),
    ],
)
def test_update_rejects_bad_shapes(metric, args, match):
    with pytest.raises(ValueError, match=match):
        metric.update(*args)


def test_constructors_validate():
    for bad in (
        lambda: LayerCKA(0, D),
        lambda: LayerCosineSimilarity(L, max_buffered_samples=0),
        lambda: EarlyExit(L, thresholds=(0.5, 1.5)),
        lambda: EarlyExit(L, layer_numbers=(1, 3, 2, 4)),
        lambda: EarlyExit(L, layer_numbers=(1, 2, 3, 4), depth=3),
        lambda: LayerNC1(L, D, 0),
    ):
        with pytest.raises(ValueError):
            bad()


# ------------------------------------------------------------------------------------------------ large offsets
OFFSET_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def offset_features(offset: float, dtype: torch.dtype) -> torch.Tensor:
    """make_features + offset, rounded to ``dtype`` (the metrics must be exact on the values they are given)."""
    return (make_features(40, n=60).to(torch.float64) * 3.0 + offset).to(dtype)


@pytest.mark.parametrize("dtype", OFFSET_DTYPES, ids=str)
@pytest.mark.parametrize("offset", [1e3, 1e6])
def test_metrics_exact_at_large_offsets_for_any_input_dtype(offset, dtype):
    """COS, saturation COS, CKA, minibatch CKA and NC1 equal float64 references on the same (rounded) values.

    The references are computed by numpy on the values minus their float64 mean (every metric here is shift
    invariant), so they carry no offset. Values that round to one constant (bf16 at 1e6: spacing 4096) have no
    direction: COS is NaN (null), not 0.0; fp16 cannot hold 1e6 (inf): every result is NaN.
    """
    h = offset_features(offset, dtype)
    h64 = np64(h)
    with np.errstate(invalid="ignore"):  # inf - inf for fp16 at 1e6
        centred = h64 - h64.mean(axis=1, keepdims=True)
    targets = torch.arange(60) % C
    saturation = torch.arange(60) % L
    metrics = {
        "cos": LayerCosineSimilarity(L),
        "sat": SaturationCosine(L),
        "cka": LayerCKA(L, D),
        "minibatch": MinibatchCKA(L),
        "nc1": LayerNC1(L, D, C),
    }
    for x, t, s in batches(h, targets, saturation, splits=(20, 17, 23)):
        metrics["cos"].update(x)
        metrics["sat"].update(x, s)
        metrics["cka"].update(x)
        metrics["minibatch"].update(x)
        metrics["nc1"].update(x, t)
    out = {name: metric.compute().numpy() for name, metric in metrics.items()}
    if not np.isfinite(h64).all():  # fp16 at 1e6
        assert all(np.isnan(value).all() for value in out.values())
        return
    with np.errstate(invalid="ignore", divide="ignore"):
        np.testing.assert_allclose(out["cos"], ref_cos(centred, False), rtol=0, atol=1e-6)
        np.testing.assert_allclose(out["cka"], ref_cka(centred), rtol=0, atol=1e-6)
        sat = [
            np.mean([ref_cos(centred[[int(s), -1], i : i + 1], False)[0, 1] for i in np.flatnonzero(saturation == s)])
            for s in range(L)
        ]
        np.testing.assert_allclose(out["sat"], sat, rtol=0, atol=1e-6)
        hsic = np.zeros((L, L))
        for chunk in (slice(0, 20), slice(20, 37), slice(37, 60)):
            hsic += [[ref_unbiased_hsic(centred[a, chunk], centred[b, chunk]) for b in range(L)] for a in range(L)]
        np.testing.assert_allclose(
            out["minibatch"], hsic / np.sqrt(np.outer(hsic.diagonal(), hsic.diagonal())), rtol=0, atol=1e-6
        )
    constant = (np.ptp(h64, axis=1) == 0).all(axis=-1)
    if constant.any():  # bf16 at 1e6: no direction left, so null rather than a cosine of 0.0
        assert np.isnan(out["cos"][constant]).all() and np.isnan(out["cka"][constant]).all()
    else:
        expected = [ref_nc1(centred[layer], targets.numpy()) for layer in range(L)]
        np.testing.assert_allclose(out["nc1"], expected, rtol=1e-6)
        assert np.isfinite(out["cos"]).all() and np.isfinite(out["cka"]).all()


def test_shifted_moments_merge_and_recentre_exactly():
    """merge_state of two LayerCKA/LayerNC1 with different shifts equals one metric that saw all the data."""
    h = offset_features(1e6, torch.float64)
    targets = torch.arange(60) % C
    whole, first, second = LayerCKA(L, D), LayerCKA(L, D), LayerCKA(L, D)
    nc_whole, nc_first, nc_second = LayerNC1(L, D, C), LayerNC1(L, D, C), LayerNC1(L, D, C)
    whole.update(h), nc_whole.update(h, targets)
    first.update(h[:, :25]), nc_first.update(h[:, :25], targets[:25])
    second.update(h[:, 25:] + 0.0), nc_second.update(h[:, 25:], targets[25:])
    assert not torch.equal(first.shift, second.shift)
    first.merge_state(second)
    nc_first.merge_state(nc_second)
    torch.testing.assert_close(first.compute(), whole.compute(), rtol=0, atol=1e-9)
    torch.testing.assert_close(nc_first.compute(), nc_whole.compute(), rtol=1e-9, atol=0)
    torch.testing.assert_close(first.compute(), torch.from_numpy(ref_cka(np64(h) - 1e6)), rtol=0, atol=1e-9)


def test_layer_mean_matches_numpy_in_float64():
    """LayerMean: the mean over rows of (L, N) values, over uneven updates, against numpy in float64."""
    from layerwise.metrics import LayerMean

    rng = np.random.default_rng(0)
    values = rng.normal(1e6, 1.0, (3, sum(SPLITS)))  # far from zero: a float32 sum would lose the digits
    metric = LayerMean(3)
    start = 0
    for size in SPLITS:
        metric.update(torch.tensor(values[:, start : start + size], dtype=torch.float32 if start else torch.float64))
        start += size
    reference = np.concatenate([values[:, :7], values[:, 7:].astype(np.float32).astype(np.float64)], 1).mean(1)
    np.testing.assert_allclose(metric.compute().numpy(), reference, rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match=r"LayerMean expects \(L=3, N\) values, got \(2, 4\)"):
        metric.update(torch.zeros(2, 4))
