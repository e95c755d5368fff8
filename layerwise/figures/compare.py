"""Figures of a comparison of two models (the ``compare`` part of a summary)."""

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from layerwise.figures.style import new_figure


def cka_across_models(compare: dict[str, Any]) -> Figure:
    """CKA between every layer of model A (rows) and of model B (columns), with the arccos distance if defined."""
    values = np.asarray(compare["cka"], dtype=float)
    fig, ax = new_figure(4.8, 4.2, right=0.95)
    image = ax.imshow(values, cmap="viridis", vmin=min(0.0, float(np.nanmin(values))), vmax=1.0)
    layers_a, layers_b = compare["layers_a"], compare["layers_b"]
    step_a, step_b = max(1, len(layers_a) // 12), max(1, len(layers_b) // 12)
    ax.set_yticks(range(0, len(layers_a), step_a), [str(layer) for layer in layers_a[::step_a]])
    ax.set_xticks(range(0, len(layers_b), step_b), [str(layer) for layer in layers_b[::step_b]])
    ax.set_ylabel(f"layer of model A ({_short(compare.get('model_a', 'the trained model'))})")
    ax.set_xlabel(f"layer of model B ({_short(compare['model_b'])})")
    distance = compare.get("arccos_distance")
    title = "CKA across models" + (f" · arccos distance {distance:.3f}" if distance is not None else "")
    ax.set_title(title, fontsize="medium")
    fig.colorbar(image, ax=ax, shrink=0.85)
    return fig


def _short(name: str) -> str:
    """A model's name for an axis: ``run/version_N`` for a checkpoint, else the last 28 characters."""
    from pathlib import Path

    path = Path(str(name))
    if path.suffix == ".ckpt" and len(path.parts) >= 4:
        return f"{path.parents[2].name}/{path.parents[1].name}"
    return str(name)[-28:]
