"""The lens figure: the shared head's probability per layer and generated position, the token in each cell."""

from collections.abc import Sequence

import numpy as np

from layerwise.figures.style import Figure, colorbar, finish, layer_ticks, new_figure, sizes


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
