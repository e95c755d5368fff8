"""Figures of a comparison of two models (the ``compare`` part of a summary)."""

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from layerwise.figures.style import SIMILARITY_LABELS, colorbar, finish, layer_ticks, new_figure, similarity_map


def cka_across_models(compare: dict[str, Any]) -> Figure:
    """CKA between every layer of model A (rows) and of model B (columns), with the arccos distance if defined."""
    values = np.asarray(compare["cka"], dtype=float)
    fig, ax = new_figure(4.6, 4.0, colorbar=True)
    image = ax.imshow(values, aspect="auto", **similarity_map(values, "cka"))
    layers_a, layers_b = compare["layers_a"], compare["layers_b"]
    layer_ticks(ax, layers_a, axis="y")
    layer_ticks(ax, layers_b, axis="x", most=8)
    ax.set_ylabel(f"layer of model A ({_short(compare.get('model_a', 'the trained model'))})")
    ax.set_xlabel(f"layer of model B ({_short(compare['model_b'])})")
    distance = compare.get("arccos_distance")
    title = "CKA across models" + (f" · arccos distance {distance:.3f}" if distance is not None else "")
    if compare.get("precision") == "fast":  # float32 products: say so on the figure, not only in the JSON
        title += " · fast"
    ax.set_title(title)
    colorbar(fig, image, ax, SIMILARITY_LABELS["cka"])
    return finish(fig)


def _short(name: str) -> str:
    """A model's name for an axis: ``run/version_N`` for a checkpoint, else the last 28 characters."""
    from pathlib import Path

    path = Path(str(name))
    if path.suffix == ".ckpt" and len(path.parts) >= 4:
        return f"{path.parents[2].name}/{path.parents[1].name}"
    return str(name)[-28:]
