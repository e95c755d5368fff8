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
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from layerwise.figures.files import write_figures
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
    DIRECT_LABEL,
    Figure,
    FigureCanvasAgg,
    direct_labels,
    dodge,
    drawn_at,
    finish,
    group_style,
    layer_ticks,
    legend_below,
    new_figure,
    panel_letter,
    place_labels,
    set_margins,
    sizes,
    stage_name,
    stamp,
    untitled,
)
from layerwise.results import find_runs, run_config, run_summaries, write_text_atomic

# figure name -> (quantity of the table, y label, title)
FIGURES = {
    "accuracy": ("accuracy", "accuracy (shared head)", "accuracy of the shared head at each layer"),
    "cos": ("cos", "COS to the last layer", "COS of each layer to the last layer"),
    "cka": ("cka", "CKA to the last layer", "CKA of each layer to the last layer"),
    "nc1": ("nc1", "NC1 (within / between class)", "NC1 of each layer"),  # short: a column-wide title fits
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
    def banded(self) -> bool:
        """Whether any group has more than one run, so that a 95 % t-interval is drawn."""
        return any(len(group.members) > 1 for group in self.groups)

    @property
    def line(self) -> str:
        """The line under every figure's title: the epoch, how it was chosen, what the bands are (if any is drawn)."""
        stage = stage_name(str(self.summaries[0].get("stage", "val"))) if self.summaries else stage_name("val")
        where = f"{stage}, epoch {self.epoch} ({self.how})"
        bands = "bands: 95 % confidence interval over seeds" if self.banded else "one run per group"
        return f"{where} · {bands}"

    def legend(self, group: str) -> str:
        """A group's legend: its label and how many runs it holds (``n = 3``), or ``1 run`` (no interval drawn)."""
        count = len(next(g for g in self.groups if g.label == group).members)
        return f"{group} (n = {count})" if count > 1 else f"{group} (1 run)"

    @property
    def interval_words(self) -> str:
        """What a band and the faint points are, in the legend: ``mean ± 95 % t-interval, n = 3; dots: each seed``."""
        counts = sorted({len(group.members) for group in self.groups if len(group.members) > 1})
        n = ", ".join(str(count) for count in counts)
        return f"mean ± 95 % t-interval, n = {n}; dots: each seed"


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
    """The t-interval of ``rows`` as a band, clipped to the quantity's range, where it is finite."""
    low = np.array([row.low for row in rows], dtype=float)
    high = np.array([row.high for row in rows], dtype=float)
    finite = np.isfinite(low) & np.isfinite(high)
    if finite.any():
        ax.fill_between(
            np.asarray(x, dtype=float), low, high, where=finite, color=colour, alpha=0.2, linewidth=0, step=step
        )


def _seeds(ax: Any, x: Sequence[float], rows: Sequence[Row], style: dict[str, Any]) -> None:
    """Each run's value as a faint point under the group's mean (nothing for a group of one run: its mean is it)."""
    if rows and rows[0].seeds > 1:
        xs = [position for position, row in zip(x, rows) for _ in row.values]
        ys = [value for row in rows for value in row.values]
        ax.scatter(xs, ys, s=9, marker=style["marker"], color=style["color"], alpha=0.35, linewidths=0, zorder=1.5)


def _lines(comparison: Comparison, quantity: str) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for row in comparison.rows:
        if row.quantity == quantity:
            out.setdefault(row.group, []).append(row)
    return out


def _legend_entries(
    ax: Any, comparison: Comparison, unreached: bool = False, labelled: bool = False
) -> tuple[list, list]:
    """The legend's entries: the groups' lines, what a band and the dots are, "not reached".

    The groups' lines only where they are not ``labelled`` at their ends; the band's words only where one is drawn.
    """
    handles, labels = ([], []) if labelled else ax.get_legend_handles_labels()
    if comparison.banded:
        handles.append(
            (Patch(facecolor="0.5", alpha=0.25, linewidth=0), Line2D([], [], color="0.3", marker="o", markersize=3.5))
        )
        labels.append(comparison.interval_words)
    if unreached:
        handles.append(Line2D([], [], color="0.3", marker="o", markerfacecolor="white", linestyle="none"))
        labels.append("open: not reached (no layer ≥ 1 − ε) in a run or more")
    return handles, labels


def _finish(
    fig: Figure, ax: Any, comparison: Comparison, title: str, unreached: bool = False, labelled: bool = False
) -> Figure:
    handles, labels = _legend_entries(ax, comparison, unreached, labelled)
    if handles:
        legend_below(fig, handles, labels, max_columns=2)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    finish(fig)
    return stamp(fig, comparison.line)


def draw_quantity(ax: Any, comparison: Comparison, name: str) -> bool:
    """Draw quantity ``name`` of a comparison on ``ax``; returns whether a point was not reached (drawn open).

    A line per group at its mean, each in its own colour, marker and dash (:func:`group_style`: groups differ in
    greyscale too), nudged sideways by a fraction of a layer so that groups that coincide stay visible; each run's
    value a faint dot beneath; the band the t-interval clipped to the quantity's range. ε-effective depth: ε on a
    categorical axis, whole-layer ticks, and an open marker at the last layer where a group's runs reach no layer
    with accuracy >= 1 − ε (the paper's convention, drawn as what it is: not reached).
    """
    quantity, ylabel, _ = FIGURES[name]
    lines = _lines(comparison, quantity)
    depth = quantity == "effective_depth"
    unreached = False
    for index, (group, rows) in enumerate(lines.items()):
        style = group_style(index)
        shift = dodge(index, len(lines), 0.16 if not depth else 0.2)
        x = [(k if depth else row.x) + shift for k, row in enumerate(rows)]
        _seeds(ax, x, rows, style)
        steps = "steps-post" if depth else "default"  # a whole layer that changes only at the ε measured
        ax.plot(
            x,
            [row.mean for row in rows],
            markersize=4,
            label=comparison.legend(group),
            zorder=3,
            drawstyle=steps,
            **style,
        )
        if rows and rows[0].seeds > 1:
            _band(ax, x, rows, style["color"], step="post" if depth else None)
        open_at = [position for position, row in zip(x, rows) if row.unreached]
        if open_at:
            unreached = True
            top = rows[0].upper
            ax.plot(
                open_at,
                [top] * len(open_at),
                linestyle="none",
                marker=style["marker"],
                markersize=5,
                markerfacecolor="white",
                markeredgecolor=style["color"],
                zorder=3.5,
            )
    first = next(iter(lines.values()))
    if depth:
        ax.set_xticks(range(len(first)), [f"{row.x:g}" for row in first])
        ax.set_xlim(-0.5, len(first) - 0.5)
        ax.set_xlabel(r"tolerance $\varepsilon$ (accuracy $\geq 1 - \varepsilon$)")
        lower, upper = first[0].lower, first[0].upper
        if math.isfinite(lower) and math.isfinite(upper):
            ax.set_ylim(lower - 0.5, upper + 0.5)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        layer_ticks(ax, [row.x for row in first], axis="x", at_values=True)
        ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    return unreached


def label_ends(fig: Figure, ax: Any, comparison: Comparison, name: str) -> bool:
    """Name each group at the right end of its mean line, in its colour, where that fits; returns whether it did.

    Per-layer quantities only (not ε-effective depth, whose steps end at the largest ε), and only when every group
    holds the same number of runs, two or more (the legend's "n = 3" then speaks for each; groups of one run or of
    different sizes keep their "(1 run)", "(n = 2)" in the legend); every group's line must end at the last layer,
    and the ends must lie apart (:func:`~layerwise.figures.style.direct_labels`). Where it does not fit, the legend
    names the groups as before.
    """
    quantity = FIGURES[name][0]
    counts = {len(group.members) for group in comparison.groups}
    if quantity == "effective_depth" or len(counts) != 1 or counts == {1}:
        return False
    lines = _lines(comparison, quantity)
    drawn = {line.get_label(): line for line in ax.get_lines()}
    ends, texts, colours = [], [], []
    for group, rows in lines.items():
        line = drawn.get(comparison.legend(group))
        if line is None or not rows or not math.isfinite(rows[-1].mean):
            return False
        xs, ys = line.get_xdata(), line.get_ydata()
        ends.append((float(xs[-1]), float(ys[-1])))
        texts.append(group)
        colours.append(line.get_color())
    return direct_labels(fig, ax, ends, texts, colours)


def per_point_figure(comparison: Comparison, name: str) -> Figure:
    """One quantity against the layer (or ε): a line per group at its mean, its band the t-interval over seeds.

    See :func:`draw_quantity`; each group named at its line's end where that fits (:func:`label_ends`), else in the
    legend below the axes, which says what the band and the dots are.
    """
    fig, ax = new_figure(5.2, 3.6)
    unreached = draw_quantity(ax, comparison, name)
    ax.set_title(FIGURES[name][2])
    finish(fig)  # the sizes the labels are measured at
    labelled = label_ends(fig, ax, comparison, name)
    return _finish(fig, ax, comparison, FIGURES[name][2], unreached, labelled)


def early_exit_figure(comparison: Comparison) -> Figure:
    """Early exit with the shared head: mean accuracy against mean speedup over τ, a line per group.

    The band is the accuracy's t-interval, the horizontal bars the speedup's; each point is labelled with its τ
    where the label fits, each run's point a faint dot beneath.
    """
    fig, ax = new_figure(5.2, 3.6)
    accuracy, speedup = _lines(comparison, "early_exit_accuracy"), _lines(comparison, "early_exit_speedup")
    points, texts, colours = [], [], []
    for index, group in enumerate(accuracy):
        style = group_style(index)
        order = np.argsort([row.mean for row in speedup[group]], kind="stable")
        across = [speedup[group][k] for k in order]
        up = [accuracy[group][k] for k in order]
        x = [row.mean for row in across]
        if up and up[0].seeds > 1:
            ax.scatter(
                [v for row in across for v in row.values],
                [v for row in up for v in row.values],
                s=9,
                marker=style["marker"],
                color=style["color"],
                alpha=0.35,
                linewidths=0,
                zorder=1.5,
            )
        ax.plot(x, [row.mean for row in up], markersize=4, label=comparison.legend(group), zorder=3, **style)
        if up and up[0].seeds > 1:
            _band(ax, x, up, style["color"])
        xerr = [0.0 if not math.isfinite(row.half_width) else row.half_width for row in across]
        if any(xerr):
            ax.errorbar(x, [row.mean for row in up], xerr=xerr, fmt="none", ecolor=style["color"], elinewidth=0.8)
        points += [(a.mean, b.mean) for a, b in zip(across, up)]
        texts += [f"{b.x:g}" for b in up]
        colours += [style["color"]] * len(up)
    ax.set_xlabel("speedup (layers in the model / mean layers run)")
    ax.set_ylabel("accuracy")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
    handles, labels = _legend_entries(ax, comparison)
    handles.append(Line2D([], [], linestyle="none"))
    labels.append("numbers: the threshold τ")
    legend_below(fig, handles, labels, max_columns=2)
    ax.grid(alpha=0.3)
    ax.set_title(FIGURES["early_exit"][2])
    finish(fig)
    place_labels(fig, ax, points, texts, colours)
    return stamp(fig, comparison.line)


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


PANEL_CHOICES = ("accuracy", "cos", "cka", "nc1", "effective_depth")


def panels_figure(comparison: Comparison, names: Sequence[str]) -> Figure:
    """Several quantities of a comparison in one figure, panels (a), (b), ... in reading order, one legend below.

    Two panels a row (one at column width for one or two panels... always two a row, as a journal's multi-panel
    figure), each drawn by :func:`draw_quantity`; errors name ``--panels``.
    """
    present = {row.quantity for row in comparison.rows}
    for name in names:
        if name not in PANEL_CHOICES:
            raise ValueError(
                f"`--panels={','.join(names)}`: {name!r} is not a panel; choose from {', '.join(PANEL_CHOICES)}."
            )
        if FIGURES[name][0] not in present:
            raise ValueError(f"`--panels={','.join(names)}`: no run has {FIGURES[name][0]!r} to draw.")
    columns = 1 if len(names) == 1 else 2
    rows = math.ceil(len(names) / columns)
    p = sizes()
    panel_height = 1.55 if p.width < 4 else 2.4
    gap_x, gap_y = (0.55 if p.width < 4 else 0.75), (0.62 if p.width < 4 else 0.72)
    height = p.bottom + p.title_line + 0.1 + rows * panel_height + (rows - 1) * gap_y
    fig = Figure(figsize=(p.width, height))
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(rows, columns, squeeze=False)).ravel()
    panel_width = (p.width - p.left - p.right - (columns - 1) * gap_x) / columns
    fig.subplots_adjust(wspace=gap_x / panel_width, hspace=gap_y / panel_height)
    set_margins(fig, left=p.left, right=p.right, bottom=p.bottom, top=0.1 + p.title_line)
    unreached = False
    for index, (ax, name) in enumerate(zip(axes, names)):
        unreached |= draw_quantity(ax, comparison, name)
        ax.grid(alpha=0.3)
        panel_letter(ax, index)
    for ax in axes[len(names) :]:
        ax.remove()
    finish(fig)
    # the groups named at their lines' ends in every panel, or in the legend (a panel where they do not fit: none)
    fits = [label_ends(fig, ax, comparison, name) for ax, name in zip(axes, names)]
    labelled = all(fits)
    if not labelled:
        for ax in axes[: len(names)]:
            for text in [child for child in ax.texts if child.get_gid() == DIRECT_LABEL]:
                text.remove()
    handles, labels = _legend_entries(axes[0], comparison, unreached, labelled)
    legend_below(fig, handles, labels, max_columns=2)
    fig.suptitle(", ".join(FIGURES[name][2] for name in names), fontsize=p.title)
    finish(fig)  # sizes only: the letters stay bold
    untitled(fig)  # a multi-panel figure's title is its caption
    setattr(fig, "_layerwise_provenance", [", ".join(FIGURES[name][2] for name in names), comparison.line])  # noqa: B010
    return fig


# ------------------------------------------------------------------------------------------------------ table
def table_texts(comparison: Comparison) -> dict[str, str]:
    """``comparison.csv`` and ``comparison.md``: the figures' numbers, and which runs each group holds."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_rows(comparison.rows))
    what = (
        "mean ± half-width of the 95 % t-interval over seeds (its ends clipped to the quantity's range in the CSV's "
        "low and high)"
        if comparison.banded
        else "one run per group, no interval"
    )
    heading = f"Validation, epoch {comparison.epoch} ({comparison.how}): {what}"
    members = [
        f"- {comparison.legend(group.label)}: {', '.join(comparison.names[i] for i in group.members)}"
        for group in comparison.groups
    ]
    text = markdown(comparison.rows, heading).replace("\n\n", "\n\n" + "\n".join(members) + "\n\n", 1)
    return {"comparison.csv": buffer.getvalue(), "comparison.md": text}


def write_comparison(
    comparison: Comparison,
    out: Path,
    formats: Sequence[str],
    width: str = "page",
    dpi: int = 150,
    titles: bool = True,
    panels: Optional[Sequence[str]] = None,
) -> list[Path]:
    """Write every figure (``comparison_<name>.<format>``, drawn at print ``width``) and the table into ``out``.

    ``panels``: also ``comparison_panels.<format>``, those quantities as panels (a), (b), ... of one figure.
    ``titles=False``: titles into the files' metadata and sidecars (:func:`~layerwise.figures.plot.write_figures`).
    """
    out.mkdir(parents=True, exist_ok=True)
    with drawn_at(width):
        figures = comparison_figures(comparison)
        if panels:
            figures["panels"] = panels_figure(comparison, panels)
    written = write_figures(figures, out, "comparison", formats, dpi, titles)
    for name, text in table_texts(comparison).items():
        written.append(write_text_atomic(out / name, text))
    return written
