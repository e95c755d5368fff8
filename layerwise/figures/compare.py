"""Figures of a comparison of two models (the ``compare`` part of a summary)."""

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from layerwise.figures.heatmap import heatmap
from layerwise.figures.style import (
    SIMILARITY_LABELS,
    SIMILARITY_RANGES,
    colorbar,
    finish,
    layer_ticks,
    new_figure,
    similarity_map,
)

# the further measures across models drawn as a heatmap each (``effective_rank_a``/``_b`` are per layer, not drawn)
CROSS_MEASURE_TITLES = {
    "cca": "Mean CCA",
    "svcca": "SVCCA",
    "pwcca": "PWCCA",
    "procrustes": "Procrustes distance",
    "shape": "Shape distance",
}


def cka_across_models(compare: dict[str, Any]) -> Figure:
    """CKA between every layer of model A (rows) and of model B (columns), with the arccos distance if defined."""
    values = np.asarray(compare["cka"], dtype=float)
    fig, ax = new_figure(4.6, 4.0, colorbar=True)
    image = ax.imshow(values, aspect="auto", **similarity_map(values, "cka"))
    layers_a, layers_b = compare["layers_a"], compare["layers_b"]
    layer_ticks(ax, layers_a, axis="y")
    layer_ticks(ax, layers_b, axis="x", most=8)
    ax.set_ylabel(_model_axes(compare)[0])
    ax.set_xlabel(_model_axes(compare)[1])
    distance = compare.get("arccos_distance")
    title = "CKA across models" + (f" · arccos distance {distance:.3f}" if distance is not None else "")
    if compare.get("precision") == "fast":  # float32 products: say so on the figure, not only in the JSON
        title += " · fast"
    ax.set_title(title)
    colorbar(fig, image, ax, SIMILARITY_LABELS["cka"])
    return finish(fig)


def measure_across_models(compare: dict[str, Any], measure: str) -> Figure:
    """A further measure (``compare["measures"][measure]``) between every layer of model A (rows) and of model B.

    As :func:`cka_across_models`, with square cells, each cell's value (up to 12 layers a side), the measure's map
    (sequential over [0, 1] for the similarities; reversed from 0 for the distances, so that near is bright) and a
    colour bar that says which way is similar. Cells without a value (``pairs="diagonal"``: all but the diagonal)
    are hatched, not coloured.
    """
    diagonal = compare.get("pairs") == "diagonal"  # the file's word is compared, never drawn
    direction = "0: the same, higher: farther" if measure in SIMILARITY_RANGES else "higher: more similar"
    return heatmap(
        compare["measures"][measure],
        compare["layers_a"],
        f"{CROSS_MEASURE_TITLES[measure]} across models",
        quantity=measure,
        name=f"{SIMILARITY_LABELS[measure]} ({direction})",
        missing="not computed (pairs=diagonal)" if diagonal else "no value",
        columns=compare["layers_b"],
        axis_labels=_model_axes(compare),
        what=CROSS_MEASURE_TITLES[measure],
    )


def compare_measure_figures(compare: dict[str, Any]) -> dict[str, Figure]:
    """``compare_<measure>``: the heatmap of each further measure of the comparison (none without ``measures``)."""
    measures = compare.get("measures") or {}
    return {
        f"compare_{name}": measure_across_models(compare, name) for name in CROSS_MEASURE_TITLES if name in measures
    }


def _model_axes(compare: dict[str, Any]) -> tuple[str, str]:
    """The axis labels of a comparison's heatmaps: (rows, columns)."""
    model_a = _short(compare.get("model_a", "the trained model"))
    return f"layer of model A ({model_a})", f"layer of model B ({_short(compare['model_b'])})"


def _short(name: str) -> str:
    """A model's name for an axis: ``run/version_N`` for a checkpoint, else the last 28 characters."""
    from pathlib import Path

    path = Path(str(name))
    if path.suffix == ".ckpt" and len(path.parts) >= 4:
        return f"{path.parents[2].name}/{path.parents[1].name}"
    return str(name)[-28:]
