"""The one style of every layerwise figure: the Agg backend, the canvas, layer ticks, and what to do without data.

Every module of ``figures/`` draws through these helpers (and nothing of another figure module's), so fonts,
margins, layer ticks and the note for missing data look the same in TensorBoard, ``layerwise plot``, the report
and the commands' figures.
"""

from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

__all__ = ["Figure", "FigureCanvasAgg", "finite_values", "layer_ticks", "new_figure", "no_data_note", "plt"]


def new_figure(width: float, height: float, right: float = 0.88) -> tuple[Figure, Any]:
    """One axes with fixed margins: a constrained layout costs a third of the drawing time at every epoch."""
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)  # no pyplot: figures may be drawn off the training loop, in a worker thread
    ax = fig.subplots()
    fig.subplots_adjust(left=0.14, right=right, bottom=0.14, top=0.9)
    return fig, ax


def finite_values(values: Any) -> np.ndarray:
    """The finite entries of nested lists (``None`` = NaN in the summaries) as a flat float array."""

    def flat(item: Any) -> Any:
        if isinstance(item, (list, tuple)):
            for inner in item:
                yield from flat(inner)
        else:
            yield np.nan if item is None else float(item)

    array = np.fromiter(flat(values), dtype=float)
    return array[np.isfinite(array)]


def no_data_note(ax: Any, what: str) -> None:
    """Say on the axes that ``what`` has no finite value to draw (NaN inputs, or nothing analysed)."""
    ax.text(0.5, 0.5, f"no finite {what} to draw", ha="center", va="center", transform=ax.transAxes, color="0.4")


def layer_ticks(ax: Any, layers: Sequence[int], axis: str = "both") -> None:
    """Layer numbers as ticks, at most about 12 of them."""
    step = max(1, len(layers) // 12)
    positions = list(range(0, len(layers), step))
    if axis in ("x", "both"):
        ax.set_xticks(positions, [str(layers[i]) for i in positions])
    if axis in ("y", "both"):
        ax.set_yticks(positions, [str(layers[i]) for i in positions])
