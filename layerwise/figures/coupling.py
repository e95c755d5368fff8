"""Figures of block coupling results (the ``coupling`` part of a summary, or the command's JSON)."""

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from layerwise.figures.style import (
    FigureCanvasAgg,
    colorbar,
    finish,
    fit_to_cells,
    layer_ticks,
    legend_below,
    legend_inside,
    new_figure,
    place_labels,
    plain,
    plt,
    set_margins,
    sizes,
)


def depth_coupling(coupling: dict[str, Any]) -> Figure:
    """One L x L mis-coupling heatmap per K (row i: J^i in the basis of column j), with the coupling score."""
    matrices = np.asarray(coupling["depth_coupling"], dtype=float)
    ks, scores = coupling["ks"], coupling["coupling_score"]
    layers = list(range(1, matrices.shape[-1] + 1))
    p = sizes()
    top = 0.2 + 3 * p.title_line
    panel = 0.75 * (p.width - p.left - p.colorbar - 0.2) / len(ks)  # about square, beside each other
    fig = Figure(figsize=(p.width, panel + p.bottom + top))
    FigureCanvasAgg(fig)
    grid = fig.subplots(1, len(ks) + 1, squeeze=False, gridspec_kw={"width_ratios": [1.0] * len(ks) + [0.06]})[0]
    axes, bar_axes = grid[:-1], grid[-1]  # the colorbar in its own column: it never covers a panel
    set_margins(fig, left=p.left, right=p.colorbar, bottom=p.bottom, top=top)
    fig.subplots_adjust(wspace=0.15)
    vmax = max(1.0, float(np.nanmax(matrices))) if np.isfinite(matrices).any() else 1.0
    for index, (ax, matrix, k, score) in enumerate(zip(axes, matrices, ks, scores)):
        image = ax.imshow(matrix, cmap="magma_r", vmin=0.0, vmax=vmax, aspect="auto")
        if index:  # one block axis for the row of panels, labelled on the first
            ax.sharey(axes[0])
            ax.tick_params(labelleft=False)
        else:
            ax.set_ylabel("block i")
        layer_ticks(ax, layers, most=8)
        ax.set_xlabel("block j (basis)")
        ax.set_title(f"K = {k}\ncoupling {score:.3f}" if score is not None else f"K = {k}")
    colorbar(fig, image, bar_axes, "mis-coupling", own_axes=True)
    fig.suptitle(plain(f"depth-wise mis-coupling ({coupling['num_prompts']} prompts, token {coupling['token']})"))
    return finish(fig)


def spectra(coupling: dict[str, Any]) -> Figure:
    """Top singular values of J^l_{tt} against depth (one line per rank k), and 1/sigma_1 on a twin axis."""
    sigma = np.asarray(coupling["sigma"], dtype=float)
    layers = np.arange(1, sigma.shape[0] + 1)
    fig, ax = new_figure(5.4, 3.8, right_axis=True)
    colors = plt.cm.viridis(np.linspace(0, 1, sigma.shape[1]))
    for k in range(sigma.shape[1]):
        ax.plot(
            layers, sigma[:, k], color=colors[k], lw=1.2, label=f"σ{k + 1}" if k in (0, sigma.shape[1] - 1) else None
        )
    ax.set_yscale("log")
    layer_ticks(ax, layers.tolist(), axis="x", at_values=True)
    ax.set_xlabel("block")
    ax.set_ylabel("singular value of J (top 15)")
    twin = ax.twinx()
    twin.plot(layers, coupling["inverse_sigma_1"], "k--", lw=1.5, label="1/σ1")
    twin.set_ylabel("1/σ1")
    lines = ax.get_legend_handles_labels()
    twin_lines = twin.get_legend_handles_labels()
    legend_below(fig, lines[0] + twin_lines[0], lines[1] + twin_lines[1])
    ax.set_title("singular spectra of the block Jacobians")
    return finish(fig)


def trajectory(coupling: dict[str, Any]) -> Figure:
    """Mean step norm ||x^l - x^{l-1}|| per block, with LSS, expodistance and linearisation cosine in the title."""
    norms = np.asarray(coupling["trajectory_step_norm"], dtype=float)
    fig, ax = new_figure(5.2, 3.6)
    blocks = list(range(1, len(norms) + 1))
    ax.plot(blocks, norms, "o-", lw=1.5, color="0.2")
    layer_ticks(ax, blocks, axis="x", at_values=True)
    ax.set_xlabel("block")
    ax.set_ylabel(r"mean step norm $\|x^l - x^{l-1}\|$")
    ax.set_title(
        f"LSS {_number(coupling['trajectory_lss'])} · ED {_number(coupling['trajectory_expodistance'])} · "
        f"linearisation cos {_number(coupling['linearisation_cosine'])}"
    )
    return finish(fig)


def token_coupling(matrix: Any, blocks: Sequence[int], k: int, mode: str = "self") -> Figure:
    """T x T token-wise mis-coupling of two blocks (``self``, ``fixed_input`` or ``fixed_output``)."""
    values = np.asarray(matrix, dtype=float)
    fig, ax = new_figure(4.4, 3.75, colorbar=True)
    fit_to_cells(fig, ax, *values.shape)
    image = ax.imshow(values, cmap="magma_r", vmin=0.0, aspect="auto")
    axis = {"self": "token", "fixed_input": "output token (input 0)", "fixed_output": "input token (output T)"}[mode]
    ax.set_xlabel(f"{axis} (block {blocks[1] + 1}, basis)")
    ax.set_ylabel(f"{axis} (block {blocks[0] + 1})")
    ax.set_title(f"token-wise mis-coupling ({mode.replace('_', ' ')}), K = {k}")
    colorbar(fig, image, ax, "mis-coupling")
    return finish(fig)


def trajectory_pca(trajectory: Any) -> Figure:
    """Every token's residual trajectory x^0..x^L projected on the top two principal axes of all its points."""
    points = np.asarray(trajectory, dtype=float)  # (L+1, T, d)
    flat = points.reshape(-1, points.shape[-1])
    centred = flat - flat.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    projected = (centred @ vt[:2].T).reshape(points.shape[0], points.shape[1], 2)
    fig, ax = new_figure(4.8, 4.2)
    colors = plt.cm.plasma(np.linspace(0, 1, points.shape[1]))
    for t in range(points.shape[1]):
        ax.plot(projected[:, t, 0], projected[:, t, 1], "-", color=colors[t], lw=0.8, alpha=0.8)
    ax.scatter(projected[0, :, 0], projected[0, :, 1], s=10, c="k", marker="o", label="x⁰ (embeddings)")
    ax.scatter(projected[-1, :, 0], projected[-1, :, 1], s=14, c="r", marker="s", label=r"$x^L$ (after the last block)")
    ax.set_xlabel("PC 1")
    ax.set_ylabel("PC 2")
    legend_inside(ax)
    ax.set_title("token trajectories (PCA)")
    return finish(fig)


def correlation(
    x: Sequence[float], y: Sequence[float], names: Sequence[str], fit: dict[str, float], xlabel: str, ylabel: str
) -> Figure:
    """Scatter of coupling score against a benchmark score, with the least-squares line, R² and p-value."""
    fig, ax = new_figure(5.2, 4.0)
    ax.scatter(x, y, s=24)
    grid = np.linspace(min(x), max(x), 50)
    ax.plot(grid, fit["intercept"] + fit["slope"] * grid, "k--", lw=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"slope {fit['slope']:.3g} · R² {fit['r2']:.3f} · p {fit['p_value']:.2g}")
    finish(fig)
    place_labels(fig, ax, list(zip(x, y)), names, ["0.2"] * len(names))  # a crowded name is left to the table
    return fig


def coupling_figures(coupling: dict[str, Any]) -> dict[str, Figure]:
    """The figures of one coupling result, keyed by a file-name stem."""
    return {
        "coupling_depth": depth_coupling(coupling),
        "coupling_spectra": spectra(coupling),
        "coupling_trajectory": trajectory(coupling),
    }


def _number(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3f}"
