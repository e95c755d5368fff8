"""Neural collapse: layerwise against the neural-collapse package's own formulas, on the same features.

The package (rhubarbwu/neural-collapse, commit c05a0b8; not on PyPI) is not a dependency: its measurement functions
are re-typed below from ``neural_collapse/measure.py``, ``kernels.py``, ``util.py`` and ``accumulate.py``, line for
line, and run in float64 (its default dtype is float32). Its accumulators take two passes (means, then the variance
norms and covariances around them); layerwise takes one (``LayerNeuralCollapse``, streamed in batches of 256 rows
with a common offset of 1e3, so the shifted sums are exercised).

Features: L = 4 "layers" of N samples, width d, K classes (one absent from the targets: the package is given the
present classes only, layerwise the whole range), increasingly collapsed with depth; the head input of NC3 is the
features themselves (an identity prefix) and W a noisy copy of the centred class means; the head's prediction of NC4
is the package's own linear classifier over the present classes, argmax_c X W_c (no bias).

    python benchmarks/nc_anchor.py                 # N = 3000, d = 48, K = 10
    python benchmarks/nc_anchor.py --n 20000 --dim 384 --classes 100

Prints the Markdown table of RESULTS.md's ``nc_anchor.py`` section: each measure, the package's function it is
compared with, and the largest absolute and relative difference over the layers. Exit status 1 when a difference
exceeds 1e-10 relative.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
import torch.linalg as la
from torch import Tensor

from layerwise.metrics import LayerNeuralCollapse

F64 = torch.float64


# ---------------------------------------------------------------------- the package's formulas, re-typed (c05a0b8)
def normalize(x: Tensor) -> Tensor:  # util.normalize
    return x / (la.norm(x, dim=-1, keepdim=True) + torch.finfo(x.dtype).eps)


def tiling(data: Tensor, kernel, tile_size=None) -> Tensor:  # util.tiling
    n = len(data)
    outgrid = torch.zeros((n, n), device=data.device, dtype=data.dtype)  # the package: float32 zeros (see below)
    tile_size = tile_size or n
    n_tiles = (n + tile_size - 1) // tile_size
    for i in range(n_tiles):
        i0, i1 = i * tile_size, min((i + 1) * tile_size, n)
        for j in range(n_tiles):
            j0, j1 = j * tile_size, min((j + 1) * tile_size, n)
            outgrid[i0:i1, j0:j1] = kernel(data[i0:i1], data[j0:j1])
    return outgrid


def symm_reduce(data: Tensor, reduce=torch.sum) -> Tensor:  # util.symm_reduce
    n = data.shape[0]
    total = 0
    for i in range((n - 1) // 2):
        upper = data[i][i + 1 :]
        lower = data[n - i - 2][n - i - 1 :]
        total += reduce(torch.cat((upper, lower)))
    if n % 2 == 0:
        total += reduce(data[n // 2 - 1][n // 2 :])
    return total / (n * (n - 1) / 2)


def class_dist_norm_vars(v_norms: Tensor, m: Tensor, dist_exp: float = 1.0) -> Tensor:  # kernels.class_dist_norm_vars
    bundled = torch.cat((m, v_norms.view(-1, 1)), dim=1)

    def kernel(tile_i, tile_j):
        vars_i, vars_j = tile_i[:, -1], tile_j[:, -1]
        var_avgs = (vars_i.unsqueeze(1) + vars_j).squeeze() / 2
        m_diff = tile_i[:, :-1].unsqueeze(1) - tile_j[:, :-1]
        return var_avgs.squeeze(0) / (torch.sum(m_diff * m_diff, dim=-1) ** dist_exp)

    return tiling(bundled, kernel)


def variability_cdnv(v_norms: Tensor, m: Tensor) -> float:  # measure.variability_cdnv
    return symm_reduce(class_dist_norm_vars(v_norms, m), torch.sum).item()


def covariance_ratio(v_intra: Tensor, m: Tensor, m_g: Tensor) -> float:  # measure.covariance_ratio, metric="pinv"
    k = m.shape[0]
    centred = m - m_g
    v_inter = centred.mT @ centred / k
    return torch.trace(la.pinv(v_inter) @ v_intra).item() / k


def mean_norms(m: Tensor, m_g: Tensor) -> Tensor:  # measure.mean_norms
    return (m - m_g).norm(dim=-1)


def structure_error(a: Tensor, b: Tensor) -> float:  # measure.structure_error
    k = a.shape[0]
    struct = b @ a.mT
    struct /= la.matrix_norm(struct)
    struct += 1 / k / math.sqrt(k - 1)
    struct.diagonal().sub_(1 / math.sqrt(k - 1))
    return la.matrix_norm(struct).item()


def simplex_etf_error(m: Tensor, m_g: Tensor) -> float:  # measure.simplex_etf_error
    return structure_error(m - m_g, m - m_g)


def self_duality_error(w: Tensor, m: Tensor, m_g: Tensor) -> float:  # measure.self_duality_error
    return structure_error(m - m_g, w)


def distance_norms(w: Tensor, m: Tensor, m_g: Tensor) -> Tensor:  # measure.distance_norms, norm=True
    return (normalize(w) - normalize(m - m_g)).norm(dim=-1)


def kernel_stats_inner(m: Tensor, m_g: Tensor) -> tuple[float, float]:
    """kernels.kernel_stats with kernel_grid's normalised centred means and an inner-product kernel: the cosines."""
    grid = tiling(normalize(m - m_g), lambda a, b: a @ b.mT)
    avg = symm_reduce(grid)
    var = symm_reduce(grid, lambda row: torch.sum((row - avg) ** 2))
    return avg.item(), var.item()


def package_accumulate(x: Tensor, y: Tensor, w: Tensor, k: int) -> dict[str, Tensor]:
    """MeanAccumulator, then VarNormAccumulator, CovarAccumulator and DecAccumulator around its means (two passes)."""
    onehot = (y[:, None] == torch.arange(k)).to(F64)  # class_idxs
    counts = onehot.sum(dim=0)
    eps = torch.finfo(F64).eps
    means = (onehot.mT @ x) / (counts.unsqueeze(1) + eps)  # compute(weighted=False)
    m_g = means.mean(dim=0)
    diff = x - means[y]
    var_norms = (onehot.mT @ diff**2).sum(dim=-1) / (counts + eps)
    covar = diff.mT @ diff / (counts.sum() + eps)
    dots = torch.inner(x, means)
    dists = (x.norm(dim=-1) ** 2).unsqueeze(1) + (means.norm(dim=-1) ** 2).unsqueeze(0) - 2 * dots
    y_ncc, y_lin = dists.argmin(dim=-1), (x @ w.mT).argmax(dim=-1)
    hits = torch.zeros(k, dtype=F64).scatter_add_(0, y, (y_lin == y_ncc).to(F64))
    agreement = (counts @ (hits / (counts + eps)) / (counts.sum() + eps)).item()  # compute(weighted=True)
    return {"means": means, "m_g": m_g, "var_norms": var_norms, "covar": covar, "agreement": agreement, "y_lin": y_lin}


# --------------------------------------------------------------------------------------------------- the run
def make_features(n: int, dim: int, k: int, layers: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k - 1, (n,), generator=g)  # class k-1 absent
    centres = torch.randn(k, dim, generator=g, dtype=F64) * 3.0
    spread = torch.linspace(6.0, 0.3, layers, dtype=F64)
    x = torch.stack([centres[y] + s * torch.randn(n, dim, generator=g, dtype=F64) for s in spread])
    centred = centres[: k - 1] - centres[: k - 1].mean(dim=0)
    w = torch.cat([centred, torch.randn(1, dim, generator=g, dtype=F64)]) + 2.0 * torch.randn(k, dim, generator=g)
    return x, y, w


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--dim", type=int, default=48)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    layers, k = 4, args.classes
    x, y, w = make_features(args.n, args.dim, k, layers, args.seed)
    present = torch.unique(y)
    k_present = present.numel()
    ours = LayerNeuralCollapse(layers, args.dim, k, head_dim=args.dim, ncc=True)
    linear = torch.stack([present[(x[layer] @ w[present].mT).argmax(dim=-1)] for layer in range(layers)])
    for start in range(0, args.n, 256):
        rows = slice(start, start + 256)
        ours.update(x[:, rows] + 1e3, y[rows], linear[:, rows], x[:, rows])  # the head input: the features, unshifted
    ours.classifier = w
    result = ours.compute()

    reference: dict[str, list[float]] = {key: [] for key in result}
    remap = torch.full((k,), -1, dtype=torch.long)
    remap[present] = torch.arange(k_present)
    for layer in range(layers):
        stats = package_accumulate(x[layer], remap[y], w[present], k_present)
        means, m_g = stats["means"], stats["m_g"]
        norms = mean_norms(means, m_g)
        cos_avg, cos_var = kernel_stats_inner(means, m_g)
        reference["nc1"].append(covariance_ratio(stats["covar"], means, m_g))
        reference["cdnv"].append(variability_cdnv(stats["var_norms"], means))
        reference["nc2_equinorm"].append((norms.std() / norms.mean()).item())  # torch.std: K - 1
        reference["nc2_cos_std"].append(math.sqrt(cos_var))
        # Han et al.'s coherence (not in the package): mean over c != c' of |cos + 1/(K-1)|, from the same grid
        grid = normalize(means - m_g) @ normalize(means - m_g).mT
        off = grid[~torch.eye(k_present, dtype=torch.bool)]
        reference["nc2_equiangular"].append((off + 1 / (k_present - 1)).abs().mean().item())
        reference["nc2_etf"].append(simplex_etf_error(means, m_g))
        reference["nc3"].append(distance_norms(w[present], means, m_g).mean().item())
        reference["nc3_duality"].append(self_duality_error(w[present], means, m_g))
        reference["nc4_agreement"].append(stats["agreement"])
        reference["nc4_ncc_accuracy"].append(float("nan"))  # the package has no NCC accuracy
        assert torch.equal(present[stats["y_lin"]], linear[layer])  # the same linear decisions as ours were given

    functions = {
        "nc1": "covariance_ratio(pinv)",
        "cdnv": "variability_cdnv",
        "nc2_equinorm": "mean_norms, std/mean",
        "nc2_cos_std": "kernel_stats (inner kernel), sqrt(var)",
        "nc2_equiangular": "(not in the package; Han et al.'s coherence)",
        "nc2_etf": "simplex_etf_error",
        "nc3": "distance_norms, mean",
        "nc3_duality": "self_duality_error",
        "nc4_agreement": "clf_ncc_agreement (DecAccumulator)",
    }
    print(f"N = {args.n}, d = {args.dim}, K = {k_present} present of {k}, L = {layers}, float64\n")
    print("| measure | package function | max abs. difference | max rel. difference |")
    print("| --- | --- | --- | --- |")
    worst = 0.0
    for key, function in functions.items():
        mine = result[key]
        theirs = torch.tensor(reference[key], dtype=F64)
        absolute = (mine - theirs).abs().max().item()
        relative = ((mine - theirs).abs() / theirs.abs().clamp_min(1e-300)).max().item()
        worst = max(worst, relative)
        print(f"| `{key}` | `{function}` | {absolute:.1e} | {relative:.1e} |")
    print(f"\nNC4 agreement per layer: {[round(v, 4) for v in result['nc4_agreement'].tolist()]}")
    return 0 if worst <= 1e-10 else 1


if __name__ == "__main__":
    sys.exit(main())
