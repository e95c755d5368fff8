"""The layer-by-layer similarity heatmap (COS, CKA), shared by the summary and CLIP figures."""

from collections.abc import Sequence
from typing import Any

import numpy as np

from layerwise.figures.style import Figure, layer_ticks, new_figure, no_data_note


def heatmap(matrix: Any, layers: Sequence[int], title: str) -> Figure:
    """Layer-by-layer similarity matrix (COS or CKA) with layer 1 at the top left."""
    values = np.asarray([[np.nan if v is None else v for v in row] for row in matrix], dtype=float)
    fig, ax = new_figure(4.6, 4.0, right=0.95)
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        no_data_note(ax, f"{title} values")
    if values.ndim != 2 or values.size == 0:  # nothing analysed: no image to draw
        ax.set_title(title)
        return fig
    image = ax.imshow(values, cmap="viridis", vmin=min(0.0, float(finite.min(initial=0.0))), vmax=1.0)
    layer_ticks(ax, layers)
    ax.set_xlabel("layer")
    ax.set_ylabel("layer")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, shrink=0.85)
    return fig
