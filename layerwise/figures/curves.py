"""Per-layer curves over training, one chart per quantity: the TensorBoard image beside its Custom Scalars chart.

TensorBoard's Custom Scalars draw every series of a run in the run's one colour (a marker per tag, the legend folded
away), so its per-layer charts cannot be read by colour. These charts draw the same series (the scalars the
callbacks logged, ``stage/<quantity>/layer_NN``) with one colour per layer (``style.layer_colour``, as in every
figure of the run) and a legend, on a log axis where the values are positive and span more than a decade.
"""

import math
import re
from collections.abc import Sequence
from typing import Any

from matplotlib.ticker import FuncFormatter

from layerwise.figures.style import (
    Figure,
    drawn_at,
    finish,
    finite_values,
    layer_colour,
    legend_below,
    new_figure,
    no_data_note,
    ordered_style,
    stage_name,
)

Points = Sequence[tuple[int, float]]  # (global step, value)
LAYER_TAG = re.compile(r"layer_(\d+)$")


def layer_curves(title: str, series: dict[str, Points], quantity: str = "") -> Figure:
    """One line per tag of ``series`` (tag -> [(global step, value)]) over the global step, a legend below.

    ``quantity`` labels the y axis (default: ``title``).

    A tag ending in ``layer_NN`` is drawn in layer NN's colour and named ``layer NN``; the others (one per
    threshold τ or ε) in the styles of ordered series, named by their last path component (``tau_0.9``: ``τ 0.9``).
    """
    fig, ax = new_figure(5.4, 3.6)
    layers = {tag: int(match.group(1)) for tag in series if (match := LAYER_TAG.search(tag))}
    depth = max(layers.values(), default=1)
    others = sorted((tag for tag in series if tag not in layers), key=_ordered_key)
    for tag in sorted(layers, key=layers.get):
        style = {"color": layer_colour(layers[tag], depth), "marker": "o"}
        _line(ax, series[tag], f"layer {layers[tag]}", style)
    for index, tag in enumerate(others):
        _line(ax, series[tag], _name(tag), ordered_style(index, len(others)))
    values = finite_values([[value for _, value in points] for points in series.values()])
    if values.size and values.min() > 0 and values.max() / values.min() > 10:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 10, not 10^1
        ax.yaxis.set_minor_formatter(FuncFormatter(_between_decades))
        title += " (log scale)"
    elif not values.size:
        no_data_note(ax, title)
    ax.set_xlabel("global step")
    ax.set_ylabel(quantity or title.split(" (log")[0])
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        legend_below(fig, handles, labels, max_columns=6)
    ax.set_title(title)
    return finish(fig)


def chart_figures(stage: str, charts: dict[str, dict[str, Points]]) -> dict[str, Any]:
    """``layerwise <stage>/<title>`` -> :func:`layer_curves` of each chart (title -> tag -> points) with a series."""
    name = stage_name(stage)
    return {
        f"layerwise {stage}/{title}": layer_curves(f"{name}: {title}", series, title.removesuffix(" per layer"))
        for title, series in charts.items()
        if series
    }


def tensorboard_chart_figures(stage: str, charts: dict[str, dict[str, Points]]) -> dict[str, Any]:
    """:func:`chart_figures` at a journal column's width (3.3 in), for TensorBoard's image cards.

    TensorBoard fits an image to a card about 330 px wide; a page-wide (6.9 in) chart's 8-pt text shrank to 5 px
    there, legible only with "actual size" ticked. At column width (100 dpi: 330 px) it is shown at its own size.
    """
    with drawn_at("column"):
        return chart_figures(stage, charts)


def _between_decades(value: float, _: Any) -> str:
    """A minor tick's label on a log axis: 2, 3 and 5 times a power of ten (20, 30, 50), the others unlabelled."""
    mantissa = value / 10 ** math.floor(math.log10(value) + 1e-9)
    return f"{value:g}" if round(mantissa, 6) in (2.0, 3.0, 5.0) else ""


def _line(ax: Any, points: Points, label: str, style: dict[str, Any]) -> None:
    ax.plot([x for x, _ in points], [y for _, y in points], markersize=3.5, linewidth=1.5, label=label, **style)


def _name(tag: str) -> str:
    """A series' name in the legend: ``val/early_exit/acc/tau_0.9`` -> ``τ 0.9``, ``eps_0.05`` -> ``ε 0.05``."""
    last = tag.rsplit("/", 1)[-1]
    for prefix, symbol in (("tau_", "τ "), ("eps_", "ε ")):
        if last.startswith(prefix):
            return symbol + last[len(prefix) :]
    return last.replace("_", " ")


def _ordered_key(tag: str) -> tuple:
    """Thresholds in numeric order (``tau_0.5`` before ``tau_0.95``), other names alphabetically."""
    number = re.search(r"(\d+(?:\.\d+)?)$", tag)
    return (0, float(number.group(1)), tag) if number else (1, 0.0, tag)
