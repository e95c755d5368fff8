"""The layer-by-layer similarity heatmap (COS, CKA), shared by the summary and CLIP figures."""

from collections.abc import Sequence
from typing import Any

import numpy as np

from layerwise.figures.style import Figure, colorbar, finish, layer_ticks, new_figure, no_data_note


def heatmap(matrix: Any, layers: Sequence[int], title: str, label: str = "") -> Figure:
    """Layer-by-layer similarity matrix (COS or CKA) with layer 1 at the top left.

    ``label`` names the colour scale (default: the title, e.g. ``COS``).
    """
    values = np.asarray([[np.nan if v is None else v for v in row] for row in matrix], dtype=float)
    fig, ax = new_figure(4.4, 3.75, colorbar=True)
    finite = values[np.isfinite(values)]
    ax.set_xlabel("layer")
    ax.set_ylabel("layer")
    ax.set_title(title)
    if finite.size == 0:
        no_data_note(ax, f"{title} values")
    if values.ndim != 2 or values.size == 0:  # nothing analysed: no image to draw
        return finish(fig)
    image = ax.imshow(values, cmap="viridis", vmin=min(0.0, float(finite.min(initial=0.0))), vmax=1.0)
    layer_ticks(ax, layers)
    colorbar(fig, image, ax, label or title)
    return finish(fig)
