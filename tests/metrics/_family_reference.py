"""Float64 numpy references of the second-moment measures on the full (N, d) feature matrices, written from the
papers and the anchors' code (anatome, netrep, Morcos et al.'s pwcca.py), independently of layerwise."""

import numpy as np


def centred(x):
    return x - x.mean(axis=0, keepdims=True)


def debiased_cka(x, y):
    """Song et al.'s unbiased HSIC_1 on the N x N linear Grams, as platonic-rep's hsic_unbiased."""

    def hsic(k, m):
        n = k.shape[0]
        k, m = k.copy(), m.copy()
        np.fill_diagonal(k, 0.0)
        np.fill_diagonal(m, 0.0)
        one = np.ones(n)
        value = np.sum(k * m.T) + k.sum() * m.sum() / ((n - 1) * (n - 2)) - 2.0 * (one @ k @ m @ one) / (n - 2)
        return value / (n * (n - 3))

    x, y = centred(x), centred(y)  # the estimator is shift invariant; uncentred Grams of x + 50 lose 8 digits
    k, m = x @ x.T, y @ y.T
    return hsic(k, m) / np.sqrt(hsic(k, k) * hsic(m, m))


def canonical_correlations(x, y):
    """Singular values of Q_x^T Q_y for the QR factors of the centred features (Press 2011; anatome cca_by_qr)."""
    qx, _ = np.linalg.qr(centred(x))
    qy, _ = np.linalg.qr(centred(y))
    return np.linalg.svd(qx.T @ qy, compute_uv=False)


def mean_cca(x, y):
    return canonical_correlations(x, y).mean()


def svcca(x, y, variance=0.99):
    """Each layer on the fewest principal components keeping ``variance`` of its variance (sigma^2), then CCA."""

    def reduce(z):
        u, s, _ = np.linalg.svd(centred(z), full_matrices=False)
        share = np.cumsum(s**2) / np.sum(s**2)
        keep = int(np.searchsorted(share, variance - 1e-12) + 1)
        return u[:, :keep] * s[:keep]

    return canonical_correlations(reduce(x), reduce(y)).mean()


def pwcca(x, y):
    """Morcos et al. (2018): weights sum_j |<P_i, x_j>| of the narrower layer's neurons on its canonical variates."""
    if x.shape[1] > y.shape[1]:
        x, y = y, x
    qx, _ = np.linalg.qr(centred(x))
    qy, _ = np.linalg.qr(centred(y))
    u, rho, _ = np.linalg.svd(qx.T @ qy, full_matrices=False)
    variates = qx @ u  # unit-norm canonical variates of x, (N, m)
    p, _ = np.linalg.qr(variates)
    weights = np.abs(p.T @ x).sum(axis=1)  # neurons uncentred, as pwcca.py: the variates are centred
    weights = weights / weights.sum()
    return float(weights @ rho)


def procrustes(x, y):
    """Ding et al. (2021): sqrt(||X||^2 + ||Y||^2 - 2 ||X^T Y||_*) of the centred, unit-Frobenius features."""
    x, y = centred(x), centred(y)
    x, y = x / np.linalg.norm(x), y / np.linalg.norm(y)
    return np.sqrt(max(0.0, 2.0 - 2.0 * np.linalg.norm(x.T @ y, ord="nuc")))


def shape_distance(x, y, alpha):
    """netrep LinearMetric(alpha, center_columns=True, zero_pad=True, score_method="angular").fit_score, re-typed."""

    def whiten(z, alpha, tol=1e-7):
        if alpha > 1 - tol:
            return z
        lam, v = np.linalg.eigh(z.T @ z)
        lam = np.maximum(lam, tol)
        d = alpha + (1 - alpha) * lam ** (-1 / 2)
        new_var = np.sum(alpha**2 * lam + 2 * alpha * (1 - alpha) * lam**0.5 + (1 - alpha) ** 2)
        d *= np.sqrt(np.sum(lam) / new_var)
        return z @ ((v * d[None, :]) @ v.T)

    width = max(x.shape[1], y.shape[1])
    x = np.pad(x, ((0, 0), (0, width - x.shape[1])))
    y = np.pad(y, ((0, 0), (0, width - y.shape[1])))
    xw, yw = whiten(centred(x), alpha), whiten(centred(y), alpha)
    u, _, vt = np.linalg.svd(xw.T @ yw)
    tx, ty = xw @ u, yw @ vt.T
    corr = np.dot(tx.ravel(), ty.ravel()) / (np.linalg.norm(tx) * np.linalg.norm(ty))
    return np.arccos(np.clip(corr, -1.0, 1.0))


def effective_rank(x, spectrum="singular"):
    """Roy & Vetterli (2007) / RankMe: exp of the entropy of the normalised singular values of the centred features."""
    s = np.linalg.svd(centred(x), compute_uv=False)
    w = s if spectrum == "singular" else s**2
    p = w / w.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


PAIR = {"debiased_cka": debiased_cka, "cca": mean_cca, "svcca": svcca, "pwcca": pwcca, "procrustes": procrustes}
