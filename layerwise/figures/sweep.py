"""The early-exit sweep figure: accuracy against speedup for every run and head kind (``layerwise sweep``)."""

import math
from collections.abc import Sequence
from typing import Any

from layerwise.figures.style import Figure, finish, legend_inside, new_figure, place_labels, series_colour


def sweep_figure(curves: Sequence[Any]) -> Figure:
    """Accuracy against speedup, one line per curve: solid for the shared head, dashed for separate heads.

    ``curves``: objects with ``label`` (the run), ``key`` (``early_exit`` or ``exit_early_exit``), ``name`` (the
    legend) and ``rows`` (dicts with ``threshold``, ``speedup``, ``accuracy``), e.g. ``commands.sweep.Curve``.
    Curves of one run share a colour; every point is annotated with its threshold τ where the label overlaps no other
    text (close thresholds get their labels on different sides; the table has every one).
    """
    fig, ax = new_figure(5.6, 4.2)
    drawn = {
        id(curve): [row for row in curve.rows if _finite(row["speedup"]) and _finite(row["accuracy"])]
        for curve in curves
    }
    colours: dict[str, Any] = {}
    for curve in curves:
        colour = colours.setdefault(curve.label, series_colour("", len(colours)))
        shared = curve.key == "early_exit"
        speedup = [row["speedup"] for row in drawn[id(curve)]]
        accuracy = [row["accuracy"] for row in drawn[id(curve)]]
        ax.plot(
            speedup,
            accuracy,
            color=colour,
            linestyle="-" if shared else "--",
            marker="o" if shared else "s",
            markersize=4,
            label=curve.name,
        )
    ax.set_xlabel("speedup (L · samples / layers run)")
    ax.set_ylabel("accuracy")
    ax.set_title("early exit: accuracy vs speedup (τ at each point)")
    ax.grid(alpha=0.3)
    legend_inside(ax)
    finish(fig)
    points = [(row["speedup"], row["accuracy"]) for curve in curves for row in drawn[id(curve)]]
    labels = [f"{row['threshold']:g}" for curve in curves for row in drawn[id(curve)]]
    place_labels(fig, ax, points, labels, [colours[curve.label] for curve in curves for _ in drawn[id(curve)]])
    return fig


def _finite(value: Any) -> bool:
    """Whether a value of a row can be drawn (a summary writes an undefined value as null)."""
    return isinstance(value, (int, float)) and math.isfinite(value)
