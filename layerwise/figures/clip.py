"""Figures of the CLIP analysis: COS within the vision and the text tower, and across them (App. D)."""

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from layerwise.figures.heatmap import heatmap
from layerwise.figures.style import SIMILARITY_LABELS, colorbar, finish, layer_ticks, new_figure, similarity_map


def cross_heatmap(matrix: Any, rows: list[int], columns: list[int], title: str) -> Figure:
    """A vision-layer (rows) by text-layer (columns) similarity matrix."""
    values = np.asarray(matrix, dtype=float)
    fig, ax = new_figure(4.6, 4.0, colorbar=True)
    image = ax.imshow(values, **similarity_map(values, "cos"))
    ax.set_aspect("auto")  # as many text layers as vision layers or not, the axes keep their size and their ticks
    layer_ticks(ax, rows, axis="y")
    layer_ticks(ax, columns, axis="x", most=8)
    ax.set_ylabel("vision layer ([CLS], projected)")
    ax.set_xlabel("text layer ([EOS], projected)")
    ax.set_title(title)
    colorbar(fig, image, ax, SIMILARITY_LABELS["cos"])
    return finish(fig)


def clip_figures(results: dict[str, Any]) -> dict[str, Figure]:
    """Vision x vision and text x text COS (raw features), vision x text COS (joint space)."""
    pairs = results["num_pairs"]
    return {
        "vision": heatmap(results["vision_cos"], results["vision_layers"], f"CLIP vision COS ({pairs} images)"),
        "text": heatmap(results["text_cos"], results["text_layers"], f"CLIP text COS ({pairs} captions)"),
        "cross": cross_heatmap(
            results["cross_cos"], results["vision_layers"], results["text_layers"], "image × caption COS"
        ),
    }
