"""The lens figure: the shared head's probability per layer and generated position, the token in each cell."""

from collections.abc import Sequence

import numpy as np

from layerwise.figures.style import Figure, colorbar, finish, new_figure, sizes


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

    Each cell holds the predicted token; the x tick labels are the generated tokens. Fixed margins, no constrained
    layout, as everywhere in :mod:`layerwise.figures`; the canvas grows with the layers and the positions.
    ``probs`` (R, P), ``tokens`` R lists of P predicted tokens,
    ``generated`` the P generated tokens, ``layers`` the R layer numbers.
    """
    num_rows, num_positions = probs.shape
    width, height = max(4.0, 0.75 * num_positions + 2.2), max(2.4, 0.32 * num_rows + 1.4)
    fig, ax = new_figure(width, height, colorbar=True)
    image = ax.imshow(probs, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    for row in range(num_rows):
        for col in range(num_positions):
            color = "black" if probs[row, col] > 0.6 else "white"
            ax.text(
                col, row, _figure_text(tokens[row][col]), ha="center", va="center", fontsize=sizes().note, color=color
            )
    step = max(1, num_rows // 16)
    ax.set_yticks(np.arange(0, num_rows, step), [str(layers[i]) for i in range(0, num_rows, step)])
    ax.set_xticks(np.arange(num_positions), [_figure_text(token) for token in generated])
    ax.set_xlabel("generated token")
    ax.set_ylabel("layer")
    ax.set_title(f"shared head per layer: {_figure_text(prompt, limit=40 if sizes().width > 5 else 16)}")
    colorbar(fig, image, ax, "probability")
    finish(fig)
    ax.tick_params(axis="x", labelsize=sizes().note)  # tokens, as narrow as a cell
    return fig
