"""The second-moment similarity measures against the anchors' own implementations on the same features.

For each measure, the largest |difference| over the layer pairs between layerwise's value (streamed over batches,
from ``LayerCKA``'s sums) and each anchor's, on the same float64 features, with what explains a difference. The
anchors installed from the registry (``repsim``, ``cca-zoo``, ``ckatorch``) are called as installed; anatome's,
netrep's, platonic-rep's and Morcos et al.'s ``pwcca.py`` formulas are re-typed below from their source (anatome
2212a8c ``anatome/distance.py``, netrep 0186b8a ``netrep/metrics/linear.py`` + ``utils.whiten``, platonic-rep dcd76ba
``metrics.py``; its ``mutual_knn`` and ``cknna`` from 07ef02a ``metrics.py`` and ``measure_alignment.py``, in torch as
there). The neighbourhood measures are compared on the rows layerwise sampled (``LayerRowSample``, streamed in
batches). An anchor that does not import is reported as such.

Run (the registry anchors live in their own environment; layerwise from the working tree)::

    python -m venv --system-site-packages /work/venvs/sim50
    /work/venvs/sim50/bin/pip install --no-deps repsim cca-zoo ckatorch seaborn
    PYTHONPATH=. /work/venvs/sim50/bin/python benchmarks/similarity_anchors.py [--markdown]
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Any, Optional

import numpy as np
import torch

from layerwise.metrics import LayerCKA, LayerRowSample
from layerwise.metrics.functional_family import MEASURES
from layerwise.metrics.functional_neighbours import NEIGHBOUR_MEASURES, neighbour_measures

LAYERS, N, DIM, BATCH = 4, 600, 24, 64
SAMPLE, TOPK = 256, 10  # the neighbourhood measures: rows sampled by global index, neighbours


def features(seed: int = 0) -> np.ndarray:
    """(L, N, d) correlated layers with decaying spectra (so SVCCA truncates), offset from the origin."""
    g = np.random.default_rng(seed)
    base = g.standard_normal((N, DIM))
    spectrum = np.geomspace(1.0, 0.01, DIM)
    stack = [
        (base @ g.standard_normal((DIM, DIM)) + 0.8 * g.standard_normal((N, DIM))) * spectrum * (1 + layer)
        for layer in range(LAYERS)
    ]
    return np.stack(stack) + 3.0


def ours(h: np.ndarray, **options: Any) -> dict[str, np.ndarray]:
    metric = LayerCKA(LAYERS, DIM, debiased=True)
    for start in range(0, N, BATCH):
        metric.update(torch.from_numpy(h[:, start : start + BATCH]))
    return {name: value.numpy() for name, value in metric.compute_measures(MEASURES, **options).items()}


def ours_neighbours(h: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The rows LayerRowSample keeps (streamed in batches with their indices) and the measures on them."""
    sample = LayerRowSample(LAYERS, SAMPLE, seed=0)
    for start in range(0, N, BATCH):
        stop = min(start + BATCH, N)
        sample.update(torch.from_numpy(h[:, start:stop]), torch.arange(start, stop))
    rows = sample.compute()
    values = neighbour_measures(rows, NEIGHBOUR_MEASURES, TOPK)
    return rows.numpy(), {name: value.numpy() for name, value in values.items()}


# ------------------------------------------------------------------------------------------ re-typed anchors
def _platonic_nearest(feats: torch.Tensor, topk: int) -> torch.Tensor:
    """platonic-rep metrics.compute_nearest_neighbors."""
    return (feats @ feats.T).fill_diagonal_(-1e8).argsort(dim=1, descending=True)[:, :topk]


def _platonic_hsic_unbiased(k: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    n = k.shape[0]
    kt, mt = k.clone().fill_diagonal_(0), m.clone().fill_diagonal_(0)
    value = (kt * mt.T).sum() + kt.sum() * mt.sum() / ((n - 1) * (n - 2)) - 2 * torch.mm(kt, mt).sum() / (n - 2)
    return value / (n * (n - 3))


def _normalise(x: np.ndarray, clip: Optional[float] = None) -> torch.Tensor:
    """measure_alignment.compute_score's F.normalize; with ``clip``, prepare_features' remove_outliers(q) first."""
    feats = torch.from_numpy(x)
    if clip is not None:  # metrics.remove_outliers(exact=False): the mean over rows of each row's |x| quantile
        q_val = torch.quantile(feats.abs().flatten(start_dim=1), clip, dim=1).mean()
        feats = feats.clamp(-q_val, q_val)
    return torch.nn.functional.normalize(feats, p=2, dim=-1)


def platonic_mutual_knn(x: np.ndarray, y: np.ndarray, topk: int = TOPK, clip: Optional[float] = None) -> float:
    """platonic-rep AlignmentMetrics.mutual_knn on L2-normalised features."""
    a, b = _normalise(x, clip), _normalise(y, clip)
    knn_a, knn_b = _platonic_nearest(a, topk), _platonic_nearest(b, topk)
    n = knn_a.shape[0]
    rows = torch.arange(n).unsqueeze(1)
    mask_a, mask_b = torch.zeros(n, n, dtype=torch.float64), torch.zeros(n, n, dtype=torch.float64)
    mask_a[rows, knn_a] = 1.0
    mask_b[rows, knn_b] = 1.0
    return float(((mask_a * mask_b).sum(dim=1) / topk).mean())


def platonic_cknna(x: np.ndarray, y: np.ndarray, topk: int = TOPK, clip: Optional[float] = None) -> float:
    """platonic-rep AlignmentMetrics.cknna (unbiased, not distance-agnostic) on L2-normalised features."""
    a, b = _normalise(x, clip), _normalise(y, clip)
    n = a.shape[0]
    k_a, k_b = a @ a.T, b @ b.T

    def similarity(k: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        k_hat, m_hat = k.clone().fill_diagonal_(float("-inf")), m.clone().fill_diagonal_(float("-inf"))
        mask_k = torch.zeros(n, n, dtype=torch.float64).scatter_(1, torch.topk(k_hat, topk, dim=1).indices, 1)
        mask_m = torch.zeros(n, n, dtype=torch.float64).scatter_(1, torch.topk(m_hat, topk, dim=1).indices, 1)
        mask = mask_k * mask_m
        return _platonic_hsic_unbiased(mask * k, mask * m)

    kl, kk, ll = similarity(k_a, k_b), similarity(k_a, k_a), similarity(k_b, k_b)
    return kl.item() / (torch.sqrt(kk * ll) + 1e-6).item()


def _centred(x: np.ndarray) -> np.ndarray:
    return x - x.mean(axis=0, keepdims=True)


def _hsic_unbiased(k: np.ndarray, m: np.ndarray) -> float:
    """platonic-rep metrics.hsic_unbiased (Song et al. 2012, eq. 5)."""
    n = k.shape[0]
    k, m = k.copy(), m.copy()
    np.fill_diagonal(k, 0.0)
    np.fill_diagonal(m, 0.0)
    value = np.sum(k * m.T) + k.sum() * m.sum() / ((n - 1) * (n - 2)) - 2 * np.sum(k @ m) / (n - 2)
    return value / (n * (n - 3))


def platonic_unbiased_cka(x: np.ndarray, y: np.ndarray) -> float:
    """platonic-rep AlignmentMetrics.unbiased_cka: Grams of the raw features, + 1e-6 in the denominator."""
    k, m = x @ x.T, y @ y.T
    return _hsic_unbiased(k, m) / (np.sqrt(_hsic_unbiased(k, k) * _hsic_unbiased(m, m)) + 1e-6)


def anatome_debiased_cka(x: np.ndarray, y: np.ndarray) -> float:
    """anatome linear_cka_distance(reduce_bias=True), returned as 1 - distance (Kornblith et al.'s helper)."""
    x, y = _centred(x), _centred(y)
    n = x.shape[0]

    def debiased(z: float, rx: np.ndarray, ry: np.ndarray, sx: float, sy: float) -> float:
        return z - n / (n - 2) * (rx @ ry) + sx * sy / ((n - 1) * (n - 2))

    rx, ry = np.einsum("ij,ij->i", x, x), np.einsum("ij,ij->i", y, y)
    dot = debiased(np.linalg.norm(y.T @ x) ** 2, rx, ry, rx.sum(), ry.sum())
    nx = np.sqrt(debiased(np.linalg.norm(x.T @ x) ** 2, rx, rx, rx.sum(), rx.sum()))
    ny = np.sqrt(debiased(np.linalg.norm(y.T @ y) ** 2, ry, ry, ry.sum(), ry.sum()))
    return 1 - (1 - dot / (nx * ny))


def _anatome_cca(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """anatome cca(backend="svd"): centred, cca_by_svd; returns the x-side coefficients and the correlations."""
    x, y = _centred(x), _centred(y)
    u1, s1, v1t = np.linalg.svd(x, full_matrices=False)
    u2, _, _ = np.linalg.svd(y, full_matrices=False)
    u, diag, _ = np.linalg.svd(u1.T @ u2, full_matrices=False)
    return v1t.T @ (1 / s1[:, None] * u), diag


def anatome_mean_cca(x: np.ndarray, y: np.ndarray) -> float:
    return float(_anatome_cca(x, y)[1].mean())


def anatome_svcca(x: np.ndarray, y: np.ndarray, accept_rate: float = 0.99) -> float:
    """anatome svcca_distance as 1 - distance: the reduction counts singular values (not sigma^2), uncentred."""

    def reduce(z: np.ndarray) -> np.ndarray:
        _, s, vt = np.linalg.svd(z, full_matrices=False)
        ratio = np.cumsum(np.abs(s)) / np.abs(s).sum()
        return z @ vt.T[:, : int((ratio < accept_rate).sum())]

    x, y = reduce(x), reduce(y)
    return float(_anatome_cca(x, y)[1].sum() / min(x.shape[1], y.shape[1]))


def repsim_svcca(x: np.ndarray, y: np.ndarray, variance: float = 0.99) -> float:
    """repsim 0.1.5's core_SVCCA (pillai) re-typed from its C++ (kisungyou/repsim ``repsim_core.hpp``).

    Each layer: an orthonormal basis U of the *uncentred* features (rank at 1e-12 of sigma_max), U centred, then
    reduced to the fewest directions keeping ``variance`` of *its* sigma^2 (U's singular values are all about 1, so
    about 99 % of the directions, not of the variance), and an orthonormal basis of that; the sum of the canonical
    correlations divided by min(rank x, rank y), the ranks *before* the reduction.
    """

    def basis(z: np.ndarray) -> np.ndarray:
        u, s, _ = np.linalg.svd(z, full_matrices=False)
        return u[:, : int((s > 1e-12 * s.max()).sum())]

    def reduce(z: np.ndarray) -> tuple[np.ndarray, int]:
        u = basis(z)
        u, s, vt = np.linalg.svd(u - u.mean(axis=0), full_matrices=False)
        share = np.cumsum(s**2) / np.sum(s**2)
        keep = min(len(s), int((share < variance).sum()) + 1)
        return basis((u[:, :keep] * s[:keep]) @ vt[:keep]), vt.shape[1]

    (qx, rank_x), (qy, rank_y) = reduce(x), reduce(y)
    return float(np.linalg.svd(qx.T @ qy, compute_uv=False).sum() / min(rank_x, rank_y))


def anatome_pwcca(x: np.ndarray, y: np.ndarray) -> float:
    """anatome pwcca_distance as 1 - distance: coefficients re-orthonormalised, weights summed over samples."""
    a, diag = _anatome_cca(x, y)
    a, _ = np.linalg.qr(a)
    alpha = np.abs(x @ a).sum(axis=0)
    return float(alpha / alpha.sum() @ diag)


def morcos_pwcca(x: np.ndarray, y: np.ndarray, side: Optional[str] = None) -> float:
    """Morcos et al.'s pwcca.compute_pwcca (epsilon=0, centred inputs): weights on the narrower layer's neurons."""
    qx, _ = np.linalg.qr(_centred(x))
    qy, _ = np.linalg.qr(_centred(y))
    u, rho, vt = np.linalg.svd(qx.T @ qy, full_matrices=False)
    use_x = x.shape[1] <= y.shape[1] if side is None else side == "x"
    variates, acts = (qx @ u, x) if use_x else (qy @ vt.T, y)
    weights = np.abs(np.linalg.qr(variates)[0].T @ acts).sum(axis=1)
    return float(weights / weights.sum() @ rho)


def anatome_procrustes(x: np.ndarray, y: np.ndarray) -> float:
    """anatome orthogonal_procrustes_distance: 1 - ||X^T Y||_* of centred unit-Frobenius features (= d^2 / 2)."""
    x, y = _centred(x), _centred(y)
    x, y = x / np.linalg.norm(x), y / np.linalg.norm(y)
    return float(1 - np.linalg.norm(x.T @ y, ord="nuc"))


def netrep_angular(x: np.ndarray, y: np.ndarray, alpha: float) -> float:
    """netrep LinearMetric(alpha, center_columns=True, zero_pad=True, score_method="angular").fit_score."""

    def whiten(z: np.ndarray, tol: float = 1e-7) -> np.ndarray:
        if alpha > 1 - tol:
            return z
        lam, v = np.linalg.eigh(z.T @ z)
        lam = np.maximum(lam, tol)
        d = alpha + (1 - alpha) * lam ** (-1 / 2)
        new_var = np.sum(alpha**2 * lam + 2 * alpha * (1 - alpha) * lam**0.5 + (1 - alpha) ** 2)
        d *= np.sqrt(np.sum(lam) / new_var)
        return z @ ((v * d[None, :]) @ v.T)

    xw, yw = whiten(_centred(x)), whiten(_centred(y))
    u, _, vt = np.linalg.svd(xw.T @ yw)
    tx, ty = xw @ u, yw @ vt.T
    return float(np.arccos(np.clip(np.dot(tx.ravel(), ty.ravel()) / (np.linalg.norm(tx) * np.linalg.norm(ty)), -1, 1)))


def rankme(x: np.ndarray, eps: float = 1e-7, centre: bool = True) -> float:
    """RankMe (Garrido et al. 2023): exp(-sum p log p), p = sigma / ||sigma||_1 + eps."""
    s = np.linalg.svd(_centred(x) if centre else x, compute_uv=False)
    p = s / np.abs(s).sum() + eps
    return float(np.exp(-(p * np.log(p)).sum()))


# -------------------------------------------------------------------------------------------- the registry
def _installed(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except Exception as error:  # noqa: BLE001 - an anchor that does not import is reported, not fatal
        return f"not importable: {type(error).__name__}: {str(error).splitlines()[0][:60]}"


def registry_anchors() -> dict[str, Any]:
    return {name: _installed(name) for name in ("repsim", "cca_zoo.linear", "ckatorch")}


def _pairwise(function: Callable[[np.ndarray, np.ndarray], float], h: np.ndarray) -> np.ndarray:
    return np.array([[function(x, y) for y in h] for x in h])


def rows(h: np.ndarray) -> list[tuple[str, str, str, str]]:
    """(measure, anchor, max |difference|, note) for every measure and anchor."""
    mine, alpha0, alpha1 = ours(h), ours(h, alpha=0.0), ours(h, alpha=1.0)
    off = ~np.eye(LAYERS, dtype=bool)
    reg = registry_anchors()
    table: list[tuple[str, str, str, str]] = []

    def add(measure: str, anchor: str, theirs: Any, mine_: np.ndarray, note: str = "", diagonal: bool = False) -> None:
        if isinstance(theirs, str):
            table.append((measure, anchor, "—", theirs))
            return
        difference = np.abs(np.asarray(theirs, dtype=float) - mine_)
        worst = difference.max() if diagonal else difference[off].max()  # a pair (l, l) is exact here, by design
        table.append((measure, anchor, f"{worst:.1e}", note))

    def registry(module: str, call: Callable[[Any], Any]) -> Any:
        return reg[module] if isinstance(reg[module], str) else call(reg[module])

    debiased = mine["debiased_cka"]
    add(
        "debiased_cka",
        "ckatorch cka_base(unbiased=True)",
        registry(
            "ckatorch",
            lambda m: _pairwise(
                lambda x, y: float(m.cka_base(torch.from_numpy(x), torch.from_numpy(y), unbiased=True)), h
            ),
        ),
        debiased,
    )
    add(
        "debiased_cka",
        "anatome linear_cka_distance(reduce_bias=True)",
        _pairwise(anatome_debiased_cka, h),
        debiased,
        "1 - its distance; Kornblith et al.'s debiased helper equals Song et al.'s estimator",
    )
    add(
        "debiased_cka",
        "platonic-rep unbiased_cka",
        _pairwise(platonic_unbiased_cka, h),
        debiased,
        "its + 1e-6 in the denominator; uncentred Grams (the estimator is shift invariant) cost digits at an offset",
    )
    add(
        "debiased_cka",
        "repsim cka(linear, song)",
        registry("repsim", lambda m: m.cka(list(h), "linear", "song")),
        debiased,
        "repsim divides the unbiased cross HSIC by the biased self HSICs ((n-1)^-2 tr KHLH): not a CKA "
        "of 1 on the diagonal; reproduced to 1e-15 by that formula",
    )
    cca = mine["cca"]
    add("cca", "anatome cca (svd) mean of diag", _pairwise(anatome_mean_cca, h), cca)
    add(
        "cca",
        "cca-zoo CCA(n_components=d).score",
        registry(
            "cca_zoo.linear", lambda m: _pairwise(lambda x, y: m.CCA(n_components=DIM).fit([x, y]).score([x, y]), h)
        ),
        cca,
    )
    add(
        "cca",
        "repsim cca(pillai)",
        registry("repsim", lambda m: m.cca(list(h), "pillai")),
        cca,
        "repsim's 'pillai' is the mean canonical correlation; its default 'yanai' the mean of rho^2",
    )
    svcca = mine["svcca"]
    add(
        "svcca",
        "repsim svcca(pillai)",
        registry("repsim", lambda m: m.svcca(list(h), "pillai")),
        svcca,
        "repsim reduces an orthonormal basis of the uncentred features (all sigma about 1: keeps 99 % of the "
        "*directions*, not of the variance) and divides the sum of the correlations by the full rank; see the next row",
    )
    add(
        "svcca",
        "repsim svcca(pillai) vs its rule re-typed",
        registry("repsim", lambda m: m.svcca(list(h), "pillai")),
        _pairwise(repsim_svcca, h),
        "repsim_svcca above, from repsim's C++ core_SVCCA: the difference is explained",
    )
    add(
        "svcca",
        "anatome svcca_distance(0.99)",
        _pairwise(anatome_svcca, h),
        svcca,
        "anatome keeps the directions whose cumulative *singular values* (not sigma^2) are < 99 %, of the uncentred "
        "features: fewer directions",
    )
    pwcca = mine["pwcca"]
    add("pwcca", "Morcos et al. pwcca.py (re-typed)", _pairwise(morcos_pwcca, h), pwcca)
    add(
        "pwcca",
        "repsim pwcca",
        registry("repsim", lambda m: m.pwcca(list(h))),
        pwcca,
        "repsim symmetrises: the mean of the two sides' PWCCA (ours weighs the row layer; see the next row)",
    )
    add(
        "pwcca",
        "repsim pwcca vs ours symmetrised",
        registry("repsim", lambda m: m.pwcca(list(h))),
        (pwcca + pwcca.T) / 2,
        "(ours + ours^T) / 2",
    )
    add(
        "pwcca",
        "anatome pwcca_distance",
        _pairwise(anatome_pwcca, h),
        pwcca,
        "anatome re-orthonormalises the CCA *coefficients* and sums |X a_i| over samples: not Morcos's weights on "
        "the neurons' projections onto the canonical variates (and not a second-moment statistic)",
    )
    add(
        "procrustes",
        "anatome orthogonal_procrustes_distance",
        _pairwise(anatome_procrustes, h),
        mine["procrustes"] ** 2 / 2,
        "anatome returns d^2 / 2 = 1 - ||X^T Y||_* (not a metric); compared as d^2 / 2",
    )
    add(
        "procrustes",
        "netrep LinearMetric(alpha=1, angular)",
        _pairwise(lambda x, y: netrep_angular(x, y, 1.0), h),
        np.arccos(1 - mine["procrustes"] ** 2 / 2),
        "the angle arccos(1 - d^2 / 2) of the same nuclear norm",
    )
    for value, computed in ((0.5, mine["shape"]), (0.0, alpha0["shape"]), (1.0, alpha1["shape"])):
        add(
            "shape",
            f"netrep LinearMetric(alpha={value}, angular)",
            _pairwise(lambda x, y, a=value: netrep_angular(x, y, a), h),
            computed,
        )
    sampled, neighbours = ours_neighbours(h)
    for name, function in (("mutual_knn", platonic_mutual_knn), ("cknna", platonic_cknna)):
        add(
            name,
            f"platonic-rep {name} (k = {TOPK}), re-typed",
            _pairwise(function, sampled),
            neighbours[name],
            f"on the {sampled.shape[1]} rows of {N} layerwise sampled by global index",
            diagonal=True,
        )
        add(
            name,
            "platonic-rep measure_alignment pipeline (remove_outliers q = 0.95)",
            _pairwise(lambda x, y, f=function: f(x, y, clip=0.95), sampled),
            neighbours[name],
            "its pipeline clips every value at the 0.95 quantile of |x| before normalising; ours does not",
            diagonal=True,
        )
    rank = mine["effective_rank"]
    add(
        "effective_rank",
        "RankMe (eps = 1e-7), centred",
        np.array([rankme(x) for x in h]),
        rank,
        "RankMe adds eps = 1e-7 to every p_k",
        diagonal=True,
    )
    add(
        "effective_rank",
        "RankMe (eps = 1e-7), uncentred",
        np.array([rankme(x, centre=False) for x in h]),
        rank,
        "RankMe takes the raw embeddings; ours centres each layer (the offset adds a direction)",
        diagonal=True,
    )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = rows(features())
    if args.markdown:
        print("| measure | anchor | max abs difference | why they differ |")
        print("|---|---|---|---|")
        for row in table:
            print("| " + " | ".join(row) + " |")
        return
    for row in table:
        print(f"{row[0]:15s} {row[1]:50s} {row[2]:>8s}  {row[3]}")


if __name__ == "__main__":
    main()
