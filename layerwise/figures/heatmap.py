"""The layer-by-layer similarity heatmap, shared by the summary, CLIP and compare figures (across two models too)."""

from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from layerwise.figures.style import (
    SIMILARITY_LABELS,
    Figure,
    cell_values,
    colorbar,
    finish,
    fit_to_cells,
    hatch_missing,
    layer_ticks,
    new_figure,
    no_data_note,
    similarity_map,
)


def heatmap(
    matrix: Any,
    layers: Sequence[int],
    title: str,
    quantity: str = "cos",
    name: Optional[str] = None,
    missing: str = "no value",
    columns: Optional[Sequence[int]] = None,
    axis_labels: tuple[str, str] = ("layer", "layer"),
    what: Optional[str] = None,
) -> Figure:
    """Layer-by-layer similarity matrix (``quantity`` ``cos`` or ``cka``) with layer 1 at the top left.

    ``name``: what was computed, in the colour bar (e.g. "minibatch CKA"; default the quantity's linear measure).
    A cell without a value (null, NaN) is hatched grey, never coloured as a value, and the x label says what the
    hatching means (``missing``: "no value", or "not computed" for the pairs a run left out).

    COS with a negative value on a diverging map centred at 0 over [-1, 1], else (and CKA) a sequential map over
    [0, 1] (:func:`~layerwise.figures.style.similarity_map`); the colour bar says what it shows in words; up to 12
    layers each cell holds its value.

    Across two models: ``layers`` label the rows (model A), ``columns`` the columns (model B), ``axis_labels`` are
    (rows, columns); ``what`` names the quantity in the note of a matrix without a finite value.
    """
    values = np.asarray([[np.nan if v is None else v for v in row] for row in matrix], dtype=float)
    fig, ax = new_figure(4.4, 3.75, colorbar=True)
    finite = values[np.isfinite(values)]
    ax.set_ylabel(axis_labels[0])
    ax.set_xlabel(axis_labels[1])
    ax.set_title(title)
    if finite.size == 0:
        no_data_note(ax, what or f"{quantity.upper()} values")
    if values.ndim != 2 or values.size == 0:  # nothing analysed: no image to draw
        return finish(fig)
    fit_to_cells(fig, ax, *values.shape)
    if finite.size and finite.size < values.size:
        hatch_missing(ax, missing)
    image = ax.imshow(values, aspect="auto", **similarity_map(values, quantity))
    layer_ticks(ax, layers, axis="y" if columns is not None else "both")
    if columns is not None:
        layer_ticks(ax, columns, axis="x", most=8)
    colorbar(fig, image, ax, SIMILARITY_LABELS[quantity] if name in (None, "CKA") else name)
    finish(fig)
    cell_values(fig, ax, image, values)
    return fig
