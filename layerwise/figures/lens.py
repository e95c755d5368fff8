"""The lens figures: the head's prediction per layer and position, the token in each cell.

The generated-text table of ``layerwise lens`` (probability per layer and generated position), and the prediction
trajectory of a prompt (``layerwise lens --trajectory``), the logit and a tuned lens side by side.
"""

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from layerwise.figures.style import (
    Figure,
    FigureCanvasAgg,
    colorbar,
    finish,
    layer_ticks,
    new_figure,
    plain,
    sizes,
)


def _visible(token: str) -> str:
    r"""A token as one printable line: a space as ``␣``, a newline as ``↵``, other control characters escaped."""
    token = token.replace(" ", "␣").replace("\n", "↵")
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode() for char in token)


def _figure_text(token: str, limit: int = 8) -> str:
    """A token for a figure cell: visible, short, and with ``$`` escaped (matplotlib reads ``$...$`` as math)."""
    text = _visible(token)
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return text.replace("$", r"\$")


def lens_figure(
    probs: np.ndarray, tokens: Sequence[Sequence[str]], generated: Sequence[str], layers: Sequence[int], prompt: str
) -> Figure:
    """Heatmap of the head's probability per layer (rows, layer 1 at the top) and generated position (columns).

    Each cell holds the predicted token, cut to the characters its width holds; the x tick labels are the generated
    tokens. Fixed margins, no constrained layout, as everywhere in :mod:`layerwise.figures`; the canvas is the print
    width (:func:`~layerwise.figures.style.sizes`) and grows in height with the layers.
    ``probs`` (R, P), ``tokens`` R lists of P predicted tokens,
    ``generated`` the P generated tokens, ``layers`` the R layer numbers.
    """
    num_rows, num_positions = probs.shape
    width = sizes().width
    fig, ax = new_figure(width, max(2.4, (0.32 if width > 5 else 0.24) * num_rows + 1.4), colorbar=True)
    image = ax.imshow(probs, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    cell = ax.get_position().width * width * 72 / num_positions  # points
    limit = max(1, min(8, int(0.9 * cell / (0.62 * sizes().note))))  # a character is at most 0.62 em wide
    for row in range(num_rows if limit > 1 else 0):  # no cell wide enough for two characters: the colours only
        for col in range(num_positions):
            color = "black" if probs[row, col] > 0.6 else "white"
            text = _figure_text(tokens[row][col], limit)
            ax.text(col, row, text, ha="center", va="center", fontsize=sizes().note, color=color)
    step = max(1, num_rows // 16)
    ax.set_yticks(np.arange(0, num_rows, step), [str(layers[i]) for i in range(0, num_rows, step)])
    if limit > 1:
        ax.set_xticks(np.arange(num_positions), [_figure_text(token, limit) for token in generated])
        ax.set_xlabel("generated token")
    else:
        layer_ticks(ax, list(range(1, num_positions + 1)), axis="x")
        ax.set_xlabel("generated position")
    ax.set_ylabel("layer")
    ax.set_title(f"shared head per layer: {_figure_text(prompt, limit=40 if sizes().width > 5 else 16)}")
    colorbar(fig, image, ax, "probability")
    finish(fig)
    ax.tick_params(axis="x", labelsize=sizes().note)  # tokens, as narrow as a cell
    return fig


TRAJECTORY_LABELS = {  # the trajectory's statistics (lens_trajectory.json keys), in words for the colour bar
    "probability": "top-1 probability",
    "entropy": "entropy (nats)",
    "kl_to_final": "KL to last (nats)",
}
_TRAJECTORY_LISTS = ("top_ids", "tokens", "probability", "entropy", "kl_to_final")


def check_trajectory(data: Any, where: str = "the trajectory") -> dict[str, Any]:
    """``data`` (a ``lens_trajectory.json`` read as JSON) if it has the trajectory's shape.

    Else one ``ValueError`` naming the key that does not fit; the file is data, nothing of it is run.
    """
    if not isinstance(data, dict) or data.get("format") != "layerwise.lens_trajectory":
        raise ValueError(f"{where}: not a layerwise lens trajectory (no format 'layerwise.lens_trajectory').")
    layers, tokens, lenses = data.get("layers"), data.get("input_tokens"), data.get("lenses")
    if not isinstance(layers, list) or not layers or not all(isinstance(v, int) for v in layers):
        raise ValueError(f"{where}: 'layers' is not a list of layer numbers.")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(v, str) for v in tokens):
        raise ValueError(f"{where}: 'input_tokens' is not a list of strings.")
    if data.get("statistic") not in TRAJECTORY_LABELS:
        raise ValueError(f"{where}: 'statistic' is not one of {', '.join(TRAJECTORY_LABELS)}.")
    if not isinstance(lenses, list) or not 1 <= len(lenses) <= 2:
        raise ValueError(f"{where}: 'lenses' is not a list of one or two lenses.")
    for index, panel in enumerate(lenses):
        if not isinstance(panel, dict) or not isinstance(panel.get("name"), str):
            raise ValueError(f"{where}: 'lenses[{index}].name' is not a string.")
        for key in _TRAJECTORY_LISTS:
            rows = panel.get(key)
            kind = str if key == "tokens" else (int if key == "top_ids" else (int, float))
            if not (
                isinstance(rows, list)
                and len(rows) == len(layers)
                and all(isinstance(row, list) and len(row) == len(tokens) for row in rows)
                and all(isinstance(v, kind) and not isinstance(v, bool) for row in rows for v in row)
            ):
                raise ValueError(f"{where}: 'lenses[{index}].{key}' is not {len(layers)} rows of {len(tokens)} values.")
    return data


def trajectory_figure(data: Mapping[str, Any], titled: bool = True) -> Figure:
    """The prediction trajectory (tuned-lens's ``PredictionTrajectory``): layer x prompt position, one panel per lens.

    ``data`` as :func:`check_trajectory` reads it (``lens_trajectory.json``): each cell is a layer's top next-token
    prediction at a prompt position, its token written in it where the cell holds two characters, coloured by
    ``data["statistic"]`` on an ordered map (cividis) shared by the panels: probability over [0, 1]; entropy over
    [0, ln V]; KL from 0 to its largest value. Rows from the first layer (bottom) to the last (top), as tuned-lens
    draws them; square cells as far as the print width and 8 in of height allow; the panels (a) logit lens and
    (b) tuned lens side by side with one colour bar; the x ticks are the prompt's tokens. ``titled=False``
    (``lens --no_title``): no title line, its text kept for the files' metadata
    (:func:`~layerwise.figures.style.provenance_metadata`); the panels keep their names.
    """
    import matplotlib

    statistic = str(data["statistic"])
    lenses = list(data["lenses"])
    layers, inputs = list(data["layers"]), list(data["input_tokens"])
    rows, columns, count = len(layers), len(inputs), len(lenses)
    values = [np.asarray(panel[statistic], dtype=float) for panel in lenses]
    high = {"probability": 1.0, "entropy": math.log(max(2, int(data.get("vocab_size") or 2)))}.get(statistic)
    if high is None:
        high = max([1e-6, *(float(np.nanmax(v)) for v in values)])
    p, width = sizes(), sizes().width
    bar, bar_gap, gap = 0.1, 0.08, 0.15  # inches: the colour bar, its distance from the panels, between panels
    room = width - p.left - p.colorbar - bar - bar_gap - gap * (count - 1)
    cell = min(room / (count * columns), 0.45)
    cell_height = min(cell, 8.0 / rows)
    label = max(len(text) for text in TRAJECTORY_LABELS.values()) * 0.6 * p.label / 72  # the colour bar's label
    cell_height = max(cell_height, (label + 0.1) / rows)  # few layers: cells taller than wide, the label fits
    titles = [
        plain(panel["name"]) if count == 1 else f"({chr(ord('a') + i)}) {plain(panel['name'])}"
        for i, panel in enumerate(lenses)
    ]
    title_width = max(len(title) for title in titles) * 0.6 * p.title / 72  # bold, about 0.6 em a character
    panel_width = max(cell * columns, min(title_width, room / count))  # a panel of few columns: as wide as its title
    axes_height = cell_height * rows
    left = p.left + (room - panel_width * count) / 2
    limit = max(1, min(8, int(0.9 * panel_width / columns * 72 / (0.62 * p.note))))  # characters a cell holds
    cell_text = limit > 1 and cell_height * 72 >= 1.2 * p.note
    step = max(1, math.ceil(0.14 / cell))  # x ticks: the tokens, every step-th where the cells are narrow
    classifier = data.get("kind") == "classifier"  # its column is a sample, named in words, not a token
    tick_text = [plain(token) if classifier else _figure_text(token, 8) for token in inputs]
    bottom = 0.1 + p.label / 72 * 1.4 + max(len(t) for t in tick_text) * 0.62 * p.tick / 72 + 0.1
    top = 0.1 + p.title_line * (2 if titled else 1)
    fig = Figure(figsize=(width, bottom + axes_height + top))
    FigureCanvasAgg(fig)
    height = bottom + axes_height + top
    cmap = matplotlib.colormaps["cividis"]
    image, first = None, None
    for index, (panel, shown) in enumerate(zip(lenses, values)):
        x0 = left + index * (panel_width + gap)
        rect = (x0 / width, bottom / height, panel_width / width, axes_height / height)
        ax = fig.add_axes(rect, sharey=first) if first is not None else fig.add_axes(rect)
        first = ax if first is None else first
        image = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=high, aspect="auto", origin="lower")
        for row in range(rows if cell_text else 0):
            for col in range(columns):
                red, green, blue, _ = cmap(min(1.0, max(0.0, shown[row, col] / high)))
                colour = "black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.5 else "white"
                text = _figure_text(panel["tokens"][row][col], limit)
                ax.text(col, row, text, ha="center", va="center", fontsize=p.note, color=colour)
        chosen = list(range(0, columns, step))
        ax.set_xticks(chosen, [tick_text[i] for i in chosen], rotation=90)
        ax.set_xlabel("input" if classifier else "input token")
        layer_ticks(ax, layers, axis="y", most=max(2, int(axes_height * 72 / (1.5 * p.tick))))
        if index == 0:
            ax.set_ylabel("layer")
        else:
            ax.tick_params(axis="y", labelleft=False)
        ax.set_title(titles[index], loc="left", fontweight="bold")
    x_bar = left + count * panel_width + (count - 1) * gap + bar_gap
    bar_axes = fig.add_axes((x_bar / width, bottom / height, bar / width, axes_height / height))
    colorbar(fig, image, bar_axes, TRAJECTORY_LABELS[statistic], own_axes=True)
    prompt = str(data.get("prompt") or "")
    named = plain(prompt) if classifier else _figure_text(prompt, 40 if width > 5 else 16)
    if titled:
        title = fig.suptitle(f"prediction trajectory: {named}")
        title.set_y(1 - 0.08 / height)
        title.set_verticalalignment("top")
    else:
        fig._layerwise_provenance = [f"prediction trajectory: {named}"]  # type: ignore[attr-defined]
    finish(fig)
    for ax in fig.axes[:-1]:
        ax.tick_params(axis="x", labelsize=p.note)
    return fig
