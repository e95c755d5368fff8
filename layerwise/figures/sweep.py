"""The early-exit sweep figure: accuracy against speedup for every run and head kind (``layerwise sweep``)."""

from collections.abc import Sequence
from typing import Any

from layerwise.figures.style import Figure, new_figure


def sweep_figure(curves: Sequence[Any]) -> Figure:
    """Accuracy against speedup, one line per curve: solid for the shared head, dashed for separate heads.

    ``curves``: objects with ``label`` (the run), ``key`` (``early_exit`` or ``exit_early_exit``), ``name`` (the
    legend) and ``rows`` (dicts with ``threshold``, ``speedup``, ``accuracy``), e.g. ``inference.sweep.Curve``.
    Curves of one run share a colour; every point is annotated with its threshold τ.
    """
    fig, ax = new_figure(6.0, 4.0, right=0.97)
    colours: dict[str, Any] = {}
    for curve in curves:
        colour = colours.setdefault(curve.label, f"C{len(colours) % 10}")
        shared = curve.key == "early_exit"
        speedup = [row["speedup"] for row in curve.rows]
        accuracy = [row["accuracy"] for row in curve.rows]
        ax.plot(
            speedup,
            accuracy,
            color=colour,
            linestyle="-" if shared else "--",
            marker="o" if shared else "s",
            markersize=4,
            label=curve.name,
        )
    _label_thresholds(fig, ax, curves, colours)
    ax.set_xlabel("speedup (L · samples / layers run)")
    ax.set_ylabel("accuracy")
    ax.set_title("early exit: accuracy vs speedup (τ at each point)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    return fig


def _label_thresholds(fig: Figure, ax: Any, curves: Sequence[Any], colours: dict[str, Any]) -> None:
    """Write τ beside each point, at the first of a few offsets where it overlaps no label already written.

    Close thresholds (τ = 0.95 and 0.99 often exit at almost the same point) get their labels on different sides;
    a label is dropped only when every offset overlaps (the table has them all).
    """
    fig.canvas.draw()  # fixes the axis limits, so that label boxes are measured where they will be drawn
    renderer = fig.canvas.get_renderer()
    placed: list[Any] = []
    offsets = ((3, 3), (3, -9), (-16, 3), (-16, -9), (3, 10), (3, -16))
    for curve in curves:
        for row in curve.rows:
            for offset in offsets:
                text = ax.annotate(
                    f"{row['threshold']:g}",
                    (row["speedup"], row["accuracy"]),
                    textcoords="offset points",
                    xytext=offset,
                    fontsize=6,
                    color=colours[curve.label],
                )
                box = text.get_window_extent(renderer)
                if not any(box.overlaps(other) for other in placed):
                    placed.append(box)
                    break
                text.remove()
