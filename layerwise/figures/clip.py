"""Figures of the CLIP analysis: COS within the vision and the text tower, and across them (App. D)."""

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from layerwise.figures.heatmap import heatmap
from layerwise.figures.style import new_figure


def cross_heatmap(matrix: Any, rows: list[int], columns: list[int], title: str) -> Figure:
    """A vision-layer (rows) by text-layer (columns) similarity matrix."""
    values = np.asarray(matrix, dtype=float)
    fig, ax = new_figure(4.8, 4.2, right=0.95)
    image = ax.imshow(values, cmap="viridis", vmin=min(0.0, float(np.nanmin(values))), vmax=float(np.nanmax(values)))
    step_r, step_c = max(1, len(rows) // 12), max(1, len(columns) // 12)
    ax.set_yticks(range(0, len(rows), step_r), [str(layer) for layer in rows[::step_r]])
    ax.set_xticks(range(0, len(columns), step_c), [str(layer) for layer in columns[::step_c]])
    ax.set_ylabel("vision layer ([CLS], projected)")
    ax.set_xlabel("text layer ([EOS], projected)")
    ax.set_title(title, fontsize="medium")
    fig.colorbar(image, ax=ax, shrink=0.85)
    return fig


def clip_figures(results: dict[str, Any]) -> dict[str, Figure]:
    """Vision x vision and text x text COS (raw features), vision x text COS (joint space)."""
    pairs = results["num_pairs"]
    return {
        "vision": heatmap(results["vision_cos"], results["vision_layers"], f"CLIP vision COS ({pairs} images)"),
        "text": heatmap(results["text_cos"], results["text_layers"], f"CLIP text COS ({pairs} captions)"),
        "cross": cross_heatmap(
            results["cross_cos"], results["vision_layers"], results["text_layers"], "image x caption COS"
        ),
    }
