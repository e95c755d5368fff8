"""Float64 numpy references of platonic-rep's mutual k-NN and CKNNA (``metrics.py``, Huh et al. 2024), re-typed
from its definitions independently of layerwise, and of the seeded row sample (splitmix64 of the global index)."""

import numpy as np


def normalised(x):
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)  # torch F.normalize(p=2, eps=1e-12)


def nearest(x, k):
    """compute_nearest_neighbors: the k largest of feats @ feats.T, the diagonal set to -1e8."""
    kernel = x @ x.T
    np.fill_diagonal(kernel, -1e8)
    return np.argsort(-kernel, axis=1, kind="stable")[:, :k]


def mutual_knn(a, b, k):
    a, b = normalised(a), normalised(b)
    n = a.shape[0]
    mask_a, mask_b = np.zeros((n, n)), np.zeros((n, n))
    rows = np.arange(n)[:, None]
    mask_a[rows, nearest(a, k)] = 1.0
    mask_b[rows, nearest(b, k)] = 1.0
    return float(((mask_a * mask_b).sum(axis=1) / k).mean())


def hsic_unbiased(k, m):
    n = k.shape[0]
    k, m = k.copy(), m.copy()
    np.fill_diagonal(k, 0.0)
    np.fill_diagonal(m, 0.0)
    value = np.sum(k * m.T) + k.sum() * m.sum() / ((n - 1) * (n - 2)) - 2.0 * np.sum(k @ m) / (n - 2)
    return value / (n * (n - 3))


def cknna(a, b, k):
    a, b = normalised(a), normalised(b)
    n = a.shape[0]
    kernel_a, kernel_b = a @ a.T, b @ b.T

    def similarity(first, second):
        masks = []
        for kernel in (first, second):
            hat = kernel.copy()
            np.fill_diagonal(hat, -np.inf)
            mask = np.zeros((n, n))
            mask[np.arange(n)[:, None], np.argsort(-hat, axis=1, kind="stable")[:, :k]] = 1.0
            masks.append(mask)
        mask = masks[0] * masks[1]
        return hsic_unbiased(mask * first, mask * second)

    return similarity(kernel_a, kernel_b) / (
        np.sqrt(similarity(kernel_a, kernel_a) * similarity(kernel_b, kernel_b)) + 1e-6
    )


def splitmix64(index, seed):
    """The keys, written with Python integers (arbitrary precision, masked to 64 bits)."""
    mask = (1 << 64) - 1
    out = []
    for i in index:
        z = (int(i) + seed * 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        out.append(z ^ (z >> 31))
    return out


def sampled_indices(num_samples, size, seed):
    """The ``size`` global indices of lowest key, in increasing index order."""
    keys = splitmix64(range(num_samples), seed)
    return sorted(sorted(range(num_samples), key=lambda i: (keys[i], i))[:size])
