"""Paper-style figures of one epoch's summary; shared by the callbacks (TensorBoard) and ``layerwise plot``."""

from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
from matplotlib.ticker import MaxNLocator

from layerwise.figures.compare import cka_across_models
from layerwise.figures.coupling import coupling_figures
from layerwise.figures.heatmap import heatmap
from layerwise.figures.residual import norm_ratio_figure
from layerwise.figures.style import Figure, finite_values, layer_ticks, new_figure, no_data_note


def similarity_and_accuracy(summary: dict[str, Any]) -> Figure:
    """COS (and CKA) of every layer to the last layer, with the shared head's accuracy per layer on a twin axis.

    One legend for both axes, below them, so that it never covers a curve.
    """
    layers = summary["layers"]
    fig, ax = new_figure(5.2, 3.8)
    fig.subplots_adjust(bottom=0.3, top=0.84)
    if summary.get("cos") is not None:
        ax.plot(layers, [row[-1] for row in summary["cos"]], marker="o", label="COS to last")
    if summary.get("cka") is not None:
        ax.plot(layers, [row[-1] for row in summary["cka"]], marker="s", label="CKA to last")
    ax.set_xlabel("layer")
    ax.set_ylabel("similarity to last layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles, labels = ax.get_legend_handles_labels()
    if summary.get("accuracy") is not None:
        twin = ax.twinx()
        accuracy = [np.nan if value is None else value for value in summary["accuracy"]]
        twin.plot(layers, accuracy, color="tab:red", marker="^", label="accuracy (shared head)")
        twin.set_ylabel("accuracy", color="tab:red")
        twin.set_ylim(0, 1.02)
        more_handles, more_labels = twin.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=len(handles), fontsize="small", frameon=False)
    ax.set_title(run_title(summary, "similarity to the last layer"))
    return fig


def cos_box_plots(
    quantiles: Sequence[Sequence[float]], levels: Sequence[float], negative: Sequence[float], layers: Sequence[int]
) -> Figure:
    """Box plots of the per-sample COS(h_l, h_L) per layer (App. B.1, Fig. 10), from quantiles of the histogram.

    Box: quartiles and median; whiskers: the 1st and 99th percentiles; dots: the smallest and largest value (each
    within half a histogram bin). The fraction of samples with a negative COS is drawn on a twin axis.
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
    fig, ax = new_figure(5.6, 3.8)
    ax.set_xlim(-0.5, len(layers) - 0.5)
    if stats:
        ax.bxp(stats, positions=drawn, widths=0.6, flierprops={"marker": ".", "markersize": 4})
    else:
        no_data_note(ax, "per-sample COS")
    ax.axhline(0.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_ylim(-1.05, 1.05)
    layer_ticks(ax, layers, axis="x")
    ax.set_xlabel("layer l")
    ax.set_ylabel("per-sample COS(h_l, h_L)")
    twin = ax.twinx()
    negative = [np.nan if value is None else 100.0 * float(value) for value in negative]
    twin.plot(range(len(layers)), negative, color="tab:red", marker=".")
    twin.set_ylabel("negative COS (% of samples)", color="tab:red")
    twin.set_ylim(bottom=0.0)
    ax.set_title("COS to the last layer, per sample", fontsize="medium")
    return fig


def ap50_per_layer(ap50: Sequence[float]) -> Figure:
    """AP at IoU 0.5 of every decoder layer's predictions (App. B.5, Fig. 18)."""
    layers = list(range(1, len(ap50) + 1))
    fig, ax = new_figure(4.8, 3.4)
    ax.plot(layers, [float("nan") if value is None else value for value in ap50], marker="o")
    ax.set_xticks(layers)
    ax.set_xlabel("decoder layer")
    ax.set_ylabel("AP50")
    ax.set_title("detection AP50 per decoder layer", fontsize="medium")
    return fig


def run_title(summary: dict[str, Any], what: str) -> str:
    """A figure title that says which validation it shows: stage, epoch and global step."""
    stage, epoch, step = summary.get("stage", "val"), summary.get("epoch", "?"), summary.get("global_step", "?")
    return f"{what}\n{stage} epoch {epoch}, step {step}"


def saturation_histogram(counts: Sequence[float], layers: Sequence[int], cos: Optional[Sequence] = None) -> Figure:
    """How many samples saturate at each layer; with the mean COS(h^l, h^L) of those samples on a twin axis."""
    fig, ax = new_figure(5.2, 3.4)
    ax.bar(layers, counts, color="tab:blue")
    ax.set_xlabel("saturation layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("samples")
    if cos is not None:
        twin = ax.twinx()
        values = [np.nan if value is None else value for value in cos]
        twin.plot(layers, values, color="tab:orange", marker="o")
        twin.set_ylabel("mean COS to last layer", color="tab:orange")
    ax.set_title("saturation events")
    return fig


def exits_per_layer(early_exit: Sequence[dict[str, Any]], layers: Sequence[int]) -> Figure:
    """Exit counts per layer for every confidence threshold, with accuracy and speedup in the legend."""
    fig, ax = new_figure(7.4, 3.4, right=0.97)
    width = 0.8 / max(1, len(early_exit))
    for i, row in enumerate(early_exit):
        offset = (i - (len(early_exit) - 1) / 2) * width
        accuracy, speedup = (f"{row[key]:.3f}" if row[key] is not None else "-" for key in ("accuracy", "speedup"))
        label = f"τ={row['threshold']:g}: acc {accuracy}, ×{speedup}"
        ax.bar(np.asarray(layers) + offset, row["exit_counts"], width=width, label=label)
    ax.set_xlabel("exit layer")
    ax.set_ylabel("samples")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.subplots_adjust(right=0.62)
    ax.set_title("early exit with the shared head")
    return fig


def effective_depth(summary: dict[str, Any]) -> Figure:
    """ε-effective depth (absolute and relative to the last layer) against ε."""
    fig, ax = new_figure(4.6, 3.6, right=0.97)
    fig.subplots_adjust(top=0.84)
    for key, label in (("effective_depth", "Acc ≥ 1−ε"), ("effective_depth_relative", "Acc ≥ Acc_L − ε")):
        depths = summary.get(key)
        if depths:
            epsilons = sorted(depths, key=float)
            ax.plot([float(e) for e in epsilons], [depths[e] for e in epsilons], marker="o", label=label)
    ax.set_xlabel("ε")
    ax.set_ylabel("effective depth (layer)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="best", fontsize="small")
    ax.set_title(run_title(summary, "ε-effective depth"), fontsize="medium")
    return fig


def summary_figures(summary: dict[str, Any]) -> dict[str, Figure]:
    """Every figure the summary has data for, keyed by a file-name stem."""
    layers = summary.get("layers")  # absent when only BlockCoupling wrote the summary
    figures: dict[str, Figure] = {}
    for key in ("cos", "cka"):
        if summary.get(key) is not None:
            figures[key] = heatmap(summary[key], layers, key.upper())
    if summary.get("cos_quantiles") is not None:
        figures["cos_distribution"] = cos_box_plots(
            [row[-1] for row in summary["cos_quantiles"]],
            summary["cos_quantile_levels"],
            [row[-1] for row in summary["cos_negative_fraction"]],
            layers,
        )
    if summary.get("cos") is not None or summary.get("cka") is not None or summary.get("accuracy") is not None:
        figures["similarity_accuracy"] = similarity_and_accuracy(summary)
    if summary.get("saturation_counts") is not None:
        figures["saturation"] = saturation_histogram(
            summary["saturation_counts"], layers, summary.get("saturation_cos")
        )
    if summary.get("early_exit"):
        figures["early_exit"] = exits_per_layer(summary["early_exit"], layers)
    if summary.get("effective_depth"):
        figures["effective_depth"] = effective_depth(summary)
    if summary.get("detection_ap50"):
        figures["detection_ap50"] = ap50_per_layer(summary["detection_ap50"])
    if summary.get("residual_norm_ratio"):
        figures["residual_norm_ratio"] = norm_ratio_figure(summary["residual_norm_ratio"])
    if summary.get("compare"):
        figures["compare_cka"] = cka_across_models(summary["compare"])
    if summary.get("coupling"):
        figures.update(coupling_figures(summary["coupling"]))
    return figures
