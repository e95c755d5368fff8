"""Paper-style figures of one epoch's summary; shared by the callbacks (TensorBoard) and ``layerwise plot``."""

import warnings
from collections.abc import Sequence
from typing import Any, Optional

import matplotlib
import numpy as np
from matplotlib.ticker import MaxNLocator, NullFormatter

from layerwise.errors import LayerwiseWarning
from layerwise.figures.compare import cka_across_models, compare_measure_figures
from layerwise.figures.coupling import coupling_figures
from layerwise.figures.heatmap import heatmap
from layerwise.figures.registry import (
    FIGURE_FUNCTIONS,
    FigureFunction,
    recorded,
    registered,
    unregistered_line,
)
from layerwise.figures.residual import norm_ratio_figure
from layerwise.figures.style import (
    Figure,
    cell_values,
    colorbar,
    dodge,
    finish,
    finite_values,
    layer_colour,
    layer_ticks,
    legend_below,
    legend_inside,
    new_figure,
    no_data_note,
    quantity_colour,
    run_line,
    series_colour,
    set_margins,
    sizes,
    stamp,
)

# What each figure of summary_figures() shows, in words: the captions of the report (and of anyone listing the figures)
CAPTIONS = {
    "cos": "COS similarity between every pair of layers",
    "cka": "CKA similarity between every pair of layers",
    "cos_distribution": "Per-sample COS of each layer to the last layer (box plots)",
    "similarity_accuracy": "Similarity to the last layer and accuracy of the shared head, per layer",
    "saturation": "Saturation events: the layer from which each sample's prediction no longer changes",
    "early_exit": "Early exit with the shared head: the share of samples exiting at each layer, per threshold τ",
    "effective_depth": "ε-effective depth: the first layer within ε of the target accuracy, a step per ε",
    "detection_ap50": "Detection AP50 of every decoder layer",
    "residual_norm_ratio": "Residual norm ratio ‖x‖ / ‖F(x)‖ per block and branch",
    "compare_cka": "CKA between the layers of model A and model B",
    "compare_cca": "Mean canonical correlation between the layers of model A and model B",
    "compare_svcca": "SVCCA between the layers of model A and model B",
    "compare_pwcca": "PWCCA (projection-weighted CCA) between the layers of model A and model B",
    "compare_procrustes": "Orthogonal Procrustes distance between the layers of model A and model B",
    "compare_shape": "Angular shape distance (netrep) between the layers of model A and model B",
    "neural_collapse": "Neural collapse per layer: NC1 and CDNV, NC2, NC3 against the shared head, NC4",
    "debiased_cka": "Debiased CKA (Song et al.'s unbiased HSIC) between every pair of layers",
    "cca": "Mean canonical correlation between every pair of layers",
    "svcca": "SVCCA between every pair of layers",
    "pwcca": "PWCCA (projection-weighted CCA) between every pair of layers",
    "procrustes": "Orthogonal Procrustes distance between every pair of layers",
    "shape": "Angular shape distance (netrep) between every pair of layers",
    "effective_rank": "Effective rank of every layer's features",
    "mutual_knn": "Mutual k-NN alignment (platonic-rep) between every pair of layers, on a seeded sample of rows",
    "cknna": "CKNNA (platonic-rep) between every pair of layers, on a seeded sample of rows",
    "coupling_depth": "Depth-wise mis-coupling of the block Jacobians",
    "coupling_spectra": "Singular spectra of the block Jacobians",
    "coupling_trajectory": "Trajectory of the prompts' tokens through the blocks (PCA)",
}


def caption(name: str) -> str:
    """The caption of figure ``name`` (a key of :func:`summary_figures`) in words; an unknown name, spaced out."""
    return CAPTIONS.get(name, name.replace("_", " ").capitalize())


def similarity_and_accuracy(summary: dict[str, Any]) -> Figure:
    """COS (and CKA) of every layer to the last layer above, the shared head's accuracy per layer below.

    Two axes sharing the layer axis, each scaled to its data: the accuracy keeps a readable scale of its own, and
    no line of one quantity seems to cross a line of the other, as on a twin axis over the same area. One legend,
    below the axes.
    """
    layers = summary["layers"]
    similarity = [key for key in ("cos", "cka") if summary.get(key) is not None]
    accuracy = summary.get("accuracy")
    if similarity and accuracy is not None:
        fig, (ax, below) = new_figure(5.2, 4.6, height_ratios=(3, 2))
    else:
        fig, ax = new_figure(5.2, 3.6)
        below = ax
    for key, marker in (("cos", "o"), ("cka", "s")):
        if key in similarity:
            values = [np.nan if row[-1] is None else row[-1] for row in summary[key]]
            name = cka_name(summary) if key == "cka" else "COS"
            ax.plot(layers, values, marker=marker, color=quantity_colour(key), label=f"{name} to the last layer")
    if similarity:
        ax.set_ylabel("similarity to\nthe last layer")
    if accuracy is not None:
        values = [np.nan if value is None else value for value in accuracy]
        below.plot(layers, values, marker="^", color=quantity_colour("accuracy"), label="accuracy (shared head)")
        below.set_ylabel("accuracy")
    below.set_xlabel("layer")
    layer_ticks(below, layers, axis="x", at_values=True)
    handles, labels = [], []
    for axes in dict.fromkeys((ax, below)):
        more_handles, more_labels = axes.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    if handles:
        legend_below(fig, handles, labels)
    ax.set_title("similarity to the last layer and accuracy per layer")
    return finish(fig)


def cos_box_plots(
    quantiles: Sequence[Sequence[float]], levels: Sequence[float], negative: Sequence[float], layers: Sequence[int]
) -> Figure:
    """Box plots of the per-sample COS(h_l, h_L) per layer (App. B.1, Fig. 10), from quantiles of the histogram.

    Box (in the layer's colour): quartiles and median; whiskers: the 1st and 99th percentiles; dots: the smallest
    and largest value (each within half a histogram bin), a legend below says so. The percentage of samples with a
    negative COS has axes of its own under the boxes, sharing the layer axis (from 0 %, at least up to 1 %), when any
    layer has one (never a twin axis over the boxes); else the title says that none has. The COS axis starts at 0
    when no quantile is negative, so that no half of the canvas is left empty.
    """
    where = {round(float(level), 6): index for index, level in enumerate(levels)}

    def at(row: Sequence[float], level: float) -> float:
        return float("nan") if row[where[level]] is None else float(row[where[level]])

    drawn = [index for index, row in enumerate(quantiles) if finite_values(row).size == len(row)]  # NaN: none
    stats = [
        {
            "med": at(row, 0.5),
            "q1": at(row, 0.25),
            "q3": at(row, 0.75),
            "whislo": at(row, 0.01),
            "whishi": at(row, 0.99),
            "fliers": [at(row, 0.0), at(row, 1.0)],
        }
        for row in (quantiles[index] for index in drawn)
    ]
    percent = np.asarray([np.nan if value is None else 100.0 * float(value) for value in negative], dtype=float)
    any_negative = bool(np.nan_to_num(percent).max(initial=0.0) > 0)
    if any_negative:
        fig, (ax, below) = new_figure(5.4, 4.8, height_ratios=(3, 1.3))
    else:
        fig, ax = new_figure(5.4, 4.0)
        below = ax
    ax.set_xlim(-0.5, len(layers) - 0.5)
    if stats:
        medians = {"color": "0.1", "linewidth": 1.5}
        boxes = ax.bxp(
            stats, positions=drawn, widths=0.6, flierprops={"marker": ".", "markersize": 4}, medianprops=medians
        )
        depth = max(layers)
        for index, box in zip(drawn, boxes["boxes"]):  # each layer in its colour, as in every figure of the run
            box.set_color(layer_colour(layers[index], depth))
            box.set_linewidth(1.5)
        lowest = float(min(min(row["whislo"], *row["fliers"]) for row in stats))
        ax.set_ylim(-1.05 if lowest < -0.5 else (min(-0.05, 1.1 * lowest) if lowest < 0 else 0.0), 1.05)
    else:
        no_data_note(ax, "per-sample COS")
        ax.set_ylim(-1.05, 1.05)
    ax.axhline(0.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_ylabel("per-sample COS$(h_l, h_L)$")
    title = "COS to the last layer, per sample"
    if any_negative:
        colour = quantity_colour("negative")
        below.bar(range(len(layers)), np.nan_to_num(percent), color=colour, width=0.6)
        below.set_ylabel("COS < 0 (%)")
        below.set_ylim(0.0, max(1.0, 1.15 * float(np.nanmax(percent))))
    elif np.isfinite(percent).any():
        title += " (none negative)"
    layer_ticks(below, layers, axis="x")
    below.set_xlabel("layer $l$")
    if stats:
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        handles = [
            Patch(facecolor="white", edgecolor="0.2", linewidth=1.2),
            Line2D([], [], color="0.2", linewidth=1.0),
            Line2D([], [], color="0.2", marker=".", linestyle="none"),
        ]
        labels = ["box: quartiles, median", "whiskers: 1st–99th percentiles", "dots: min, max"]
        legend_below(fig, handles, labels, max_columns=3)
    ax.set_title(title)
    return finish(fig)


def _points_per_layer(
    values: Sequence[Optional[float]], layers: Sequence[int], label: str, ylabel: str, title: str
) -> Figure:
    """One value per layer as points on a line; ``label`` names the layers on the x axis."""
    fig, ax = new_figure(4.8, 3.6)
    ax.plot(list(layers), [float("nan") if value is None else value for value in values], marker="o")
    layer_ticks(ax, list(layers), axis="x", at_values=True)
    ax.set_xlabel(label)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return finish(fig)


def ap50_per_layer(ap50: Sequence[float]) -> Figure:
    """AP at IoU 0.5 of every decoder layer's predictions (App. B.5, Fig. 18)."""
    layers = range(1, len(ap50) + 1)
    return _points_per_layer(ap50, layers, "decoder layer", "AP50", "detection AP50 per decoder layer")


def effective_rank_per_layer(ranks: Sequence[Optional[float]], layers: Optional[Sequence[int]]) -> Figure:
    """The effective rank of every layer's features (Roy & Vetterli; RankMe), a point per layer."""
    numbers = list(layers) if layers else range(1, len(ranks) + 1)
    return _points_per_layer(ranks, numbers, "layer", "effective rank", "effective rank per layer")


def saturation_histogram(counts: Sequence[float], layers: Sequence[int], cos: Optional[Sequence] = None) -> Figure:
    """How many samples saturate at each layer; below it, the mean COS(h^l, h^L) of those samples.

    The COS has its own axes under the bars, sharing the layer axis: on a twin axis its line ran across the bars
    as if it measured them.
    """
    if cos is not None:
        fig, (ax, below) = new_figure(5.2, 4.6, height_ratios=(3, 2))
    else:
        fig, ax = new_figure(5.2, 3.8)
        below = ax
    depth = max(layers) if len(layers) else 1
    ax.bar(layers, counts, color=[layer_colour(layer, depth) for layer in layers])
    if len(layers):
        ax.set_xlim(min(layers) - 0.7, max(layers) + 0.7)  # one layer: a bar, not a filled canvas
    ax.set_ylabel("samples")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # a count of samples: whole numbers
    if cos is not None:
        values = [np.nan if value is None else value for value in cos]
        below.plot(layers, values, color=quantity_colour("cos"), marker="o")
        below.set_ylabel("their mean COS\nto the last layer")
    below.set_xlabel("saturation layer")
    layer_ticks(below, layers, axis="x", at_values=True)
    ax.set_title("saturation events")
    return finish(fig)


def exits_per_layer(early_exit: Sequence[dict[str, Any]], layers: Sequence[int]) -> Figure:
    """Early exit as a τ × exit-layer heatmap: the share of each threshold's samples that exit at each layer.

    One row per confidence threshold τ (lowest at the top), labelled by τ alone; its accuracy (%) and speedup sit in
    two uncoloured columns before the layers (as long tick labels they took 40 % of a column's width; with too many
    layers for such columns, in the row labels); up to 12 layers each cell holds its share. Seven τ lines tangled
    near zero, two of them in nearly one colour, read worse.
    """
    fig, ax = new_figure(5.4, 3.2, colorbar=True)
    counts = np.asarray(
        [[np.nan if value is None else value for value in row["exit_counts"]] for row in early_exit], dtype=float
    ).reshape(len(early_exit), -1)
    totals = np.nansum(counts, axis=1, keepdims=True)
    shares = np.divide(counts, totals, out=np.full_like(counts, np.nan), where=totals > 0)
    # accuracy and speedup in two uncoloured columns where a cell holds "100" (else, many layers: in the row labels)
    cell = ax.get_position().width * fig.get_size_inches()[0] / (shares.shape[1] + 2)
    columns = cell >= 0.2  # inches: "100" at 7 pt is 0.15 in wide
    accuracy = ["–" if row["accuracy"] is None else f"{100 * row['accuracy']:.0f}" for row in early_exit]
    speedup = ["–" if row["speedup"] is None else f"{row['speedup']:.1f}" for row in early_exit]
    shown = np.hstack([np.full((len(early_exit), 2), np.nan), shares]) if columns else shares
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
    image = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    taus = [f"{row['threshold']:g}" for row in early_exit]
    if columns:
        ax.set_yticks(range(len(early_exit)), taus)
    else:
        ax.set_yticks(range(len(early_exit)), [f"{t}: {a} %, ×{s}" for t, a, s in zip(taus, accuracy, speedup)])
    layer_ticks(ax, layers, axis="x")
    if columns:
        positions = [2 + tick for tick in ax.get_xticks()]
        labels = [label.get_text() for label in ax.get_xticklabels()]
        ax.set_xticks([0, 1, *positions], ["%", "×", *labels])
        ax.axvline(1.5, color="0.3", linewidth=0.8)
    ax.set_xlabel("accuracy %, speedup ×, exit layer" if columns else "exit layer")
    ax.set_ylabel("threshold τ" if columns else "τ: accuracy, speedup")
    ax.set_title("early exit with the shared head")
    colorbar(fig, image, ax, "share of samples exiting")
    finish(fig)
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # the Agg canvas style.py selects
    widest = max((label.get_window_extent(renderer).width for label in ax.get_yticklabels()), default=0.0) / fig.dpi
    # the labels, the tick marks, the axis label, and room for the wider hinting of a 150 dpi PNG (0.06 in at 3.3 in)
    set_margins(fig, left=widest + 0.2 + 2 * sizes().label / 72)
    cell_values(fig, ax, image, shown, most=14 if columns else 12)  # up to 12 layers, and the two columns
    for index in range(len(early_exit) if columns else 0):
        for column, text in ((0, accuracy[index]), (1, speedup[index])):
            ax.text(column, index, text, ha="center", va="center", fontsize=sizes().note, color="black")
    return fig


def effective_depth(summary: dict[str, Any]) -> Figure:
    """ε-effective depth (absolute and relative to the last layer) against ε: a step per ε, whole layers.

    The depth is a whole layer that changes only at the ε values measured, so it is drawn as steps over the ε (equally
    spaced, as categories), not as sloped lines between them, with whole-layer ticks over every layer. Where no layer
    reaches ``1 − ε`` (``effective_depth_reached`` false) the paper sets the depth to the last layer: drawn there as
    an open marker, and the legend says "not reached", never as a depth reached. The two variants differ in marker and
    dash and sit a little apart, so that one never hides the other.
    """
    fig, ax = new_figure(4.8, 3.8)
    measured: list[str] = []
    missed = {eps for eps, flag in (summary.get("effective_depth_reached") or {}).items() if flag is False}
    variants = [
        ("effective_depth", r"accuracy $\geq 1 - \varepsilon$", {"marker": "o", "linestyle": "-"}),
        (
            "effective_depth_relative",
            r"accuracy $\geq$ last layer's $- \varepsilon$",
            {"marker": "s", "linestyle": "--"},
        ),
    ]
    drawn = [(key, label, style) for key, label, style in variants if summary.get(key)]
    for key, _, _ in drawn:
        measured = sorted(set(measured) | set(summary[key]), key=float)
    position = {eps: index for index, eps in enumerate(measured)}
    open_points = False
    for index, (key, label, style) in enumerate(drawn):
        depths, colour = summary[key], series_colour("", index)
        shift = dodge(index, len(drawn), 0.12)
        epsilons = sorted(depths, key=float)
        unreached = {eps for eps in epsilons if key == "effective_depth" and eps in missed}
        x = [position[eps] + shift for eps in epsilons]
        y = [np.nan if depths[eps] is None or eps in unreached else depths[eps] for eps in epsilons]
        ax.plot(x, y, drawstyle="steps-post", color=colour, label=label, **style)
        if unreached:
            open_points = True
            ax.plot(
                [position[eps] + shift for eps in epsilons if eps in unreached],
                [depths[eps] for eps in epsilons if eps in unreached],
                linestyle="none",
                marker=style["marker"],
                markerfacecolor="white",
                markeredgecolor=colour,
                markersize=7,
                label=r"not reached (no layer $\geq 1 - \varepsilon$; the last layer by convention)",
            )
    ax.set_xlabel(r"tolerance $\varepsilon$")
    ax.set_ylabel("effective depth (layer)")
    if measured:
        ax.set_xticks(range(len(measured)), [f"{float(e):g}" for e in measured])
        ax.set_xlim(-0.5, len(measured) - 0.5)
    layers = summary.get("layers") or []
    if layers:
        ax.set_ylim(min(layers) - 0.5, max(layers) + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        (legend_below if open_points else legend_inside)(*((fig, handles, labels) if open_points else (ax,)))
    ax.set_title(r"$\varepsilon$-effective depth")
    return finish(fig)


def _similarity_options(summary: dict[str, Any]) -> dict[str, Any]:
    """The options of the similarity analysis the summary's ``analyses`` records (empty for an older summary)."""
    return ((summary.get("analyses") or {}).get("similarity") or {}).get("options") or {}


def cka_name(summary: dict[str, Any]) -> str:
    """What the summary's ``cka`` is: "minibatch CKA" (the estimator the summary's ``analyses`` records), else CKA."""
    return "minibatch CKA" if _similarity_options(summary).get("cka") == "minibatch" else "CKA"


# The panels of the neural-collapse figure: (y label, log scale, [(key, legend label)]), top to bottom
_COLLAPSE_PANELS = (
    ("variability", True, [("nc1", r"NC1 $\mathrm{tr}(\Sigma_W \Sigma_B^\dagger)/K$"), ("cdnv", "CDNV")]),
    (
        "NC2",
        False,
        [
            ("nc2_equinorm", "equinorm (CV of norms)"),
            ("nc2_cos_std", "std of cosines"),
            ("nc2_equiangular", r"mean $|\cos + 1/(K-1)|$"),
            ("nc2_etf", "simplex-ETF error"),
        ],
    ),
    ("NC3", False, [("nc3", "class means to head rows"), ("nc3_duality", "self-duality error")]),
    ("NC4", False, [("nc4_agreement", "NCC agrees with the head"), ("nc4_ncc_accuracy", "NCC accuracy")]),
)


def neural_collapse(summary: dict[str, Any]) -> Figure:
    """NC1 and CDNV (log scale), NC2, NC3 and NC4 against the layer, one panel each (those the summary holds)."""
    panels = [panel for panel in _COLLAPSE_PANELS if any(summary.get(key) is not None for key, _ in panel[2])]
    fig, axes = new_figure(4.8, 1.9 * len(panels) + 0.6, height_ratios=[1.0] * len(panels))
    axes = axes if isinstance(axes, list) else [axes]
    layers = list(summary.get("layers") or range(1, len(summary["nc1"]) + 1))
    for ax, (label, log, series) in zip(axes, panels):
        drawn = False
        for index, (key, name) in enumerate(series):
            values = [np.nan if value is None else value for value in summary.get(key) or []]
            if values and np.isfinite(values).any() and (not log or np.nanmax(values) > 0):
                colour = series_colour(key, index if index < 3 else index + 1)  # never NC1's purple (the 4th)
                ax.plot(layers, values, marker="o", color=colour, label=name)
                drawn = True
        if not drawn:
            no_data_note(ax, label)
        elif log:
            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(NullFormatter())  # decades only: minor labels crowd a narrow range
        ax.set_ylabel(label)
        if drawn:
            legend_inside(ax)
    layer_ticks(axes[-1], layers, axis="x", at_values=True)
    axes[-1].set_xlabel("layer")
    axes[0].set_title("neural collapse per layer")
    return finish(fig)


def neural_collapse_figures(summary: dict[str, Any]) -> dict[str, Figure]:
    """The figure of ``NeuralCollapseMonitor(complete=True)`` (NC1 alone has its column in the report and ``plot``)."""
    return {"neural_collapse": neural_collapse(summary)} if summary.get("cdnv") is not None else {}


# the titles of the further similarity measures' heatmaps (JSON key -> words)
MEASURE_TITLES = {
    "debiased_cka": "Debiased CKA",
    "cca": "Mean CCA",
    "svcca": "SVCCA",
    "pwcca": "PWCCA",
    "procrustes": "Procrustes distance",
    "shape": "Shape distance",
    "mutual_knn": "Mutual k-NN",
    "cknna": "CKNNA",
}


def similarity_figures(summary: dict[str, Any]) -> dict[str, Figure]:
    """The figures of ``LayerSimilarityMonitor``: the COS and CKA heatmaps, the COS box plots, the per-layer profile."""
    layers = summary.get("layers")
    figures: dict[str, Figure] = {}
    pairs = _similarity_options(summary).get("pairs")
    pairs = pairs if pairs in ("to_last", "adjacent") else "all"  # the file's word is compared, never drawn
    missing = "no value" if pairs == "all" else f"not computed (pairs={pairs})"
    if summary.get("cos") is not None:
        figures["cos"] = heatmap(summary["cos"], layers, "COS between every pair of layers", "cos")
    if summary.get("cka") is not None:
        name = cka_name(summary)
        some = pairs != "all" and name == "CKA"  # the minibatch CKA is on every pair
        title = f"{name} between {'pairs' if some else 'every pair'} of layers"
        figures["cka"] = heatmap(summary["cka"], layers, title, "cka", name, missing=missing)
    for key in MEASURE_TITLES:  # the further measures a user asked for (LayerSimilarityMonitor's `measures`)
        if summary.get(key) is not None:
            title = f"{MEASURE_TITLES[key]} between {'every pair' if pairs == 'all' else 'pairs'} of layers"
            figures[key] = heatmap(summary[key], layers, title, key, missing=missing)
    if summary.get("effective_rank") is not None:
        figures["effective_rank"] = effective_rank_per_layer(summary["effective_rank"], layers)
    if summary.get("cos_quantiles") is not None:
        figures["cos_distribution"] = cos_box_plots(
            [row[-1] for row in summary["cos_quantiles"]],
            summary["cos_quantile_levels"],
            [row[-1] for row in summary["cos_negative_fraction"]],
            layers,
        )
    if summary.get("cos") is not None or summary.get("cka") is not None:
        figures["similarity_accuracy"] = similarity_and_accuracy(summary)
    return figures


def logit_lens_figures(summary: dict[str, Any]) -> dict[str, Figure]:
    """The figures of ``LogitLensMonitor``: saturation and early exit, and the per-layer profile without a COS/CKA.

    With a COS or CKA in the summary the profile (similarity and accuracy per layer) is :func:`similarity_figures`'s.
    """
    layers = summary.get("layers")
    figures: dict[str, Figure] = {}
    if summary.get("accuracy") is not None and summary.get("cos") is None and summary.get("cka") is None:
        figures["similarity_accuracy"] = similarity_and_accuracy(summary)
    if summary.get("saturation_counts") is not None:
        figures["saturation"] = saturation_histogram(
            summary["saturation_counts"], layers, summary.get("saturation_cos")
        )
    if summary.get("early_exit"):
        figures["early_exit"] = exits_per_layer(summary["early_exit"], layers)
    return figures


def effective_depth_figures(summary: dict[str, Any]) -> dict[str, Figure]:
    """The figure of ``EffectiveDepthMonitor``: the ε-effective depth against ε."""
    return {"effective_depth": effective_depth(summary)} if summary.get("effective_depth") else {}


def detection_figures(ap50: Sequence[float]) -> dict[str, Figure]:
    """The figure of ``DetectionLayerAP`` (its results: AP50 per decoder layer)."""
    return {"detection_ap50": ap50_per_layer(ap50)}


def residual_figures(results: dict[str, Any]) -> dict[str, Figure]:
    """The figure of ``ResidualNormRatioMonitor``."""
    return {"residual_norm_ratio": norm_ratio_figure(results)}


def compare_figures(results: dict[str, Any]) -> dict[str, Figure]:
    """The figures of ``CrossModelComparison``: CKA between the layers of the two models, and each of ``measures``."""
    return {"compare_cka": cka_across_models(results), **compare_measure_figures(results)}


# The package's analyses' figure functions with the key each reads (None: the whole summary), in the order a summary
# without a record of its figure functions (FIGURE_FUNCTIONS; layerwise 0.2.0 and earlier) is drawn. The callbacks
# name the same functions (tests/figures/test_registry.py keeps the two equal).
PACKAGE_FIGURES: tuple[tuple[FigureFunction, Optional[str]], ...] = (
    (similarity_figures, None),
    (logit_lens_figures, None),
    (effective_depth_figures, None),
    (neural_collapse_figures, None),
    (detection_figures, "detection_ap50"),
    (residual_figures, "residual_norm_ratio"),
    (compare_figures, "compare"),
    (coupling_figures, "coupling"),
)


def summary_figures(
    summary: dict[str, Any], functions: Optional[Sequence[FigureFunction]] = None, where: str = "the summary"
) -> dict[str, Figure]:
    """Every figure of a summary, keyed by a file-name stem: what the registered functions it names draw, stamped.

    The summary's :data:`~layerwise.figures.registry.FIGURE_FUNCTIONS` *names* the functions (the package's own for
    a summary that names none); a name is drawn only when it is registered (:mod:`layerwise.figures.registry`): the
    package's functions, ``functions`` (the objects the running code passes: a live fit's callbacks, ``--figures``)
    and the plug-ins of the entry-point group ``layerwise.figures``. Any other name is skipped with one warning line
    saying how to register it, and nothing is imported for it. A package function reads the key the package gives
    it, whatever the file says; a function whose key the summary lacks draws nothing; one that fails is skipped with
    one line naming it and ``where`` (the file), the others still draw.
    """
    entries = summary.get(FIGURE_FUNCTIONS)
    if entries is None:
        entries = recorded(PACKAGE_FIGURES)
    package_keys = recorded(PACKAGE_FIGURES)
    allowed, failures = registered((function for function, _ in PACKAGE_FIGURES), functions or (), entries)
    for line in failures:
        warnings.warn(f"layerwise: {line}.", LayerwiseWarning, stacklevel=2)
    figures: dict[str, Figure] = {}
    for name, key in entries.items():
        if name not in allowed:
            warnings.warn(unregistered_line(name, where), LayerwiseWarning, stacklevel=2)
            continue
        key = package_keys.get(name, key)
        if key is not None and not summary.get(key):
            continue
        try:
            figures.update(allowed[name](summary if key is None else summary[key]))
        except Exception as error:  # a user's function, or a value the schema lets through: the rest still draws
            read = "the summary" if key is None else f"`{key}`"
            warnings.warn(
                f"layerwise: the figure function {name} could not draw {read} of {where} "
                f"({type(error).__name__}: {str(error)[:200]}); skipped.",
                LayerwiseWarning,
                stacklevel=2,
            )
    line = run_line(summary)
    return {name: stamp(figure, line) for name, figure in figures.items()}


def evaluation_figures(
    stage: str, summary: dict[str, Any], functions: Optional[Sequence[FigureFunction]] = None
) -> dict[str, Figure]:
    """What a training run logs of one evaluation: :func:`summary_figures` of its summary, tagged ``stage/name``.

    The one table from results to figures: the callbacks hand the drawing process the JSON they write into the
    summary (with its ``stage``, ``epoch``, ``global_step`` and the figure functions they name), and ``layerwise
    plot`` and ``report`` draw the same function from the file, so a figure logged during training is the figure
    ``plot`` writes from that summary, a user's own analysis's included.
    """
    return {f"{stage}/{name}": figure for name, figure in summary_figures(summary, functions).items()}
