"""Several runs on one set of axes: the figures and the table of ``layerwise plot RUN...`` and ``report RUN...``.

Reads each run's summaries (:mod:`layerwise.results`), picks one epoch for all of them, groups seeds and computes
each group's mean and 95 % t-interval (:mod:`layerwise.figures.seeds`), and draws one figure per quantity through
:mod:`layerwise.figures.style`: a line per group, its band the t-interval, the number of seeds in the legend, and
under the title the epoch and how it was chosen. ``comparison.csv`` and ``comparison.md`` hold the same numbers.
"""

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
from matplotlib.ticker import MaxNLocator

from layerwise.figures.seeds import (
    CSV_FIELDS,
    Group,
    Row,
    choose_epoch,
    comparison_rows,
    csv_rows,
    group_runs,
    layer_counts,
    markdown,
)
from layerwise.figures.style import (
    Figure,
    drawn_at,
    finish,
    layer_ticks,
    legend_below,
    new_figure,
    series_colour,
    stage_name,
    stamp,
)
from layerwise.results import find_runs, run_config, run_summaries, save_figures, write_text_atomic

# figure name -> (quantity of the table, y label, title)
FIGURES = {
    "accuracy": ("accuracy", "accuracy (shared head)", "accuracy of the shared head at each layer"),
    "cos": ("cos", "COS to the last layer", "COS of each layer to the last layer"),
    "cka": ("cka", "CKA to the last layer", "CKA of each layer to the last layer"),
    "nc1": ("nc1", "NC1", "NC1 (within- / between-class variability) per layer"),
    "cdnv": ("cdnv", "CDNV", "CDNV (class-distance normalised variance) per layer"),
    "nc2_equinorm": ("nc2_equinorm", "CV of class-mean norms", "NC2 equinorm per layer"),
    "nc2_equiangular": ("nc2_equiangular", r"mean $|\cos + 1/(K-1)|$", "NC2 equiangularity per layer"),
    "nc2_etf": ("nc2_etf", "simplex-ETF error", "NC2 distance to a simplex ETF per layer"),
    "nc3": ("nc3", "distance to the head's rows", "NC3 class means against the shared head per layer"),
    "nc4_agreement": ("nc4_agreement", "NCC agreement with the head", "NC4 nearest-class-centre agreement per layer"),
    "kl_to_final": ("kl_to_final", "KL to the final layer (nats)", "KL from the final layer's distribution per layer"),
    "effective_depth": ("effective_depth", "effective depth (layer)", r"$\varepsilon$-effective depth"),
    "early_exit": ("early_exit_accuracy", "accuracy", "early exit: accuracy against speedup over τ"),
}
TABLE = ("comparison.csv", "comparison.md")


@dataclass(frozen=True)
class Comparison:
    """Several runs read and grouped at one epoch: what the figures, the table and the report are drawn from."""

    runs: tuple[Path, ...]
    names: tuple[str, ...]
    groups: tuple[Group, ...]
    epoch: int
    how: str  # how the epoch was chosen, in words
    summaries: tuple[dict[str, Any], ...]
    rows: tuple[Row, ...]

    @property
    def line(self) -> str:
        """The line under every figure's title: the epoch, how it was chosen, what the bands are."""
        stage = stage_name(str(self.summaries[0].get("stage", "val"))) if self.summaries else stage_name("val")
        return f"{stage}, epoch {self.epoch} ({self.how}) · bands: 95 % confidence interval over seeds"

    def legend(self, group: str) -> str:
        """A group's legend: its label and how many runs it holds."""
        count = len(next(g for g in self.groups if g.label == group).members)
        return f"{group} ({count} seeds)" if count > 1 else f"{group} (1 run)"


def run_name(run: Path) -> str:
    """A short name of a run folder: ``name/version_N`` for TensorBoard's and CSV's layouts, else its name."""
    return f"{run.parent.name}/{run.name}" if run.name.startswith("version_") else run.name


def load_comparison(
    paths: Sequence[Path], labels: Optional[Sequence[str]] = None, epoch: str = "last", option: str = "path"
) -> Comparison:
    """Read, group and reduce the runs that ``paths`` name (see :func:`layerwise.results.find_runs`).

    ``labels``: one per run or one per path (the runs of a glob share its label); runs that share a label are one
    group. Errors are one line naming the option.
    """
    found = find_runs(paths, option=option)
    runs = [run for _, run in found]
    names = [run_name(run) for run in runs]
    if labels is not None:
        if len(labels) == len(runs):
            per_run = list(labels)
        elif len(labels) == len(paths):
            per_run = [labels[index] for index, _ in found]
        else:
            raise ValueError(
                f"`--label`: {len(labels)} labels for {len(runs)} runs named by {len(paths)} paths; give one per run "
                "or one per path (runs sharing a label are one group)."
            )
    by_epoch = [run_summaries(run) for run in runs]
    for name, epochs in zip(names, by_epoch):
        if not epochs:
            raise FileNotFoundError(f"{option} {name}: the run has no layerwise/val_epoch_*.json.")
    chosen, how = choose_epoch(by_epoch, names, epoch)
    summaries: list[dict[str, Any]] = [run[chosen] for run in by_epoch]
    counts = layer_counts(summaries)
    if len(set(counts)) > 1:
        have = ", ".join(f"{name}: {count}" for name, count in zip(names, counts))
        raise ValueError(
            f"{option}: the runs have different numbers of layers ({have}); compare runs of one depth on one axis."
        )
    groups = group_runs([run_config(run) for run in runs], names, per_run if labels is not None else None)
    rows = comparison_rows(groups, summaries)
    return Comparison(tuple(runs), tuple(names), tuple(groups), chosen, how, tuple(summaries), tuple(rows))


# ------------------------------------------------------------------------------------------------------ figures
def _band(ax: Any, x: Sequence[float], rows: Sequence[Row], colour: Any, step: Optional[str] = None) -> None:
    """The t-interval of ``rows`` as a band, where it is finite (``step="post"`` under a step plot)."""
    low = np.array([row.low for row in rows], dtype=float)
    high = np.array([row.high for row in rows], dtype=float)
    finite = np.isfinite(low) & np.isfinite(high)
    if finite.any():
        ax.fill_between(
            np.asarray(x, dtype=float), low, high, where=finite, color=colour, alpha=0.2, linewidth=0, step=step
        )


def _lines(comparison: Comparison, quantity: str) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for row in comparison.rows:
        if row.quantity == quantity:
            out.setdefault(row.group, []).append(row)
    return out


def _finish(fig: Figure, ax: Any, comparison: Comparison, title: str) -> Figure:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        legend_below(fig, handles, labels)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    finish(fig)
    return stamp(fig, comparison.line)


def per_point_figure(comparison: Comparison, name: str) -> Figure:
    """One quantity against the layer (or ε): a line per group at its mean, its band the t-interval over seeds.

    Series colours are the house's colour-blind palette (:func:`series_colour`). ε-effective depth, a whole layer
    that changes only at the ε measured, is a step plot over those ε (its summary key ``effective_depth``: the first
    layer whose accuracy is >= 1 - ε), with whole-number layer ticks.
    """
    quantity, ylabel, title = FIGURES[name]
    fig, ax = new_figure(5.2, 3.6)
    lines = _lines(comparison, quantity)
    steps = quantity == "effective_depth"
    for index, (group, rows) in enumerate(lines.items()):
        colour = series_colour(group, index)
        x = [row.x for row in rows]
        ax.plot(
            x,
            [row.mean for row in rows],
            marker="o",
            markersize=4,
            color=colour,
            label=comparison.legend(group),
            drawstyle="steps-post" if steps else "default",
        )
        _band(ax, x, rows, colour, step="post" if steps else None)
    first = next(iter(lines.values()))
    if steps:
        ax.set_xticks([row.x for row in first], [f"{row.x:g}" for row in first])
        ax.set_xlabel(r"tolerance $\varepsilon$ (accuracy $\geq 1 - \varepsilon$)")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        layer_ticks(ax, [row.x for row in first], axis="x", at_values=True)
        ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    return _finish(fig, ax, comparison, title)


def early_exit_figure(comparison: Comparison) -> Figure:
    """Early exit with the shared head: mean accuracy against mean speedup over τ, a line per group.

    The band is the accuracy's t-interval, the horizontal bars the speedup's.
    """
    fig, ax = new_figure(5.2, 3.6)
    accuracy, speedup = _lines(comparison, "early_exit_accuracy"), _lines(comparison, "early_exit_speedup")
    for index, group in enumerate(accuracy):
        colour = series_colour(group, index)
        order = np.argsort([row.mean for row in speedup[group]], kind="stable")
        across = [speedup[group][k] for k in order]
        up = [accuracy[group][k] for k in order]
        x = [row.mean for row in across]
        ax.plot(x, [row.mean for row in up], marker="o", markersize=4, color=colour, label=comparison.legend(group))
        _band(ax, x, up, colour)
        xerr = [0.0 if not math.isfinite(row.half_width) else row.half_width for row in across]
        if any(xerr):
            ax.errorbar(x, [row.mean for row in up], xerr=xerr, fmt="none", ecolor=colour, elinewidth=0.8)
    ax.set_xlabel("speedup (layers in the model / mean layers run)")
    ax.set_ylabel("accuracy")
    return _finish(fig, ax, comparison, FIGURES["early_exit"][2])


def comparison_figures(comparison: Comparison) -> dict[str, Figure]:
    """Every figure of a comparison by name (``accuracy``, ``cos``, ``cka``, ``nc1``, ``effective_depth``, ...).

    A quantity no run has is left out.
    """
    present = {row.quantity for row in comparison.rows}
    figures = {}
    for name, (quantity, _, _) in FIGURES.items():
        if quantity in present:
            figures[name] = (
                early_exit_figure(comparison) if name == "early_exit" else per_point_figure(comparison, name)
            )
    return figures


# ------------------------------------------------------------------------------------------------------ table
def table_texts(comparison: Comparison) -> dict[str, str]:
    """``comparison.csv`` and ``comparison.md``: the figures' numbers, and which runs each group holds."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_rows(comparison.rows))
    heading = (
        f"Validation, epoch {comparison.epoch} ({comparison.how}): mean ± half-width of the 95 % t-interval over seeds"
    )
    members = [
        f"- {comparison.legend(group.label)}: {', '.join(comparison.names[i] for i in group.members)}"
        for group in comparison.groups
    ]
    text = markdown(comparison.rows, heading).replace("\n\n", "\n\n" + "\n".join(members) + "\n\n", 1)
    return {"comparison.csv": buffer.getvalue(), "comparison.md": text}


def write_comparison(comparison: Comparison, out: Path, formats: Sequence[str], width: str = "page") -> list[Path]:
    """Write every figure (``comparison_<name>.<format>``, drawn at print ``width``) and the table into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with drawn_at(width):
        figures = comparison_figures(comparison)
    written = save_figures(figures, out, "comparison", formats)
    for name, text in table_texts(comparison).items():
        written.append(write_text_atomic(out / name, text))
    return written
