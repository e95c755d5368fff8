"""The residual norm ratio per layer (App. B.2, Fig. 11-12 of Jiang et al.), from the summary's results."""

from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from layerwise.figures.style import (
    finish,
    finite_values,
    layer_ticks,
    legend_below,
    new_figure,
    no_data_note,
    plain,
    series_colour,
)


def norm_ratio_figure(results: dict[str, Any]) -> Figure:
    """||x|| / ||F(x)|| per layer: one line per branch (the median), its interquartile band, the mean dashed.

    The title says at which token the ratio was read (:func:`where_read`), not as if the model's head read it there.
    """
    layers = results["layers"]
    levels = [round(float(level), 6) for level in results["quantile_levels"]]
    title = f"residual norm ratio, {where_read(results)}"
    fig, ax = new_figure(5.4, 3.6, title_lines=title.count("\n") + 1)
    for index, name in enumerate(results["branches"]):
        color = series_colour(name, index)
        rows = results["quantiles"][index]

        def level(q: float, rows: Any = rows) -> list[float]:
            return [float("nan") if row[levels.index(q)] is None else row[levels.index(q)] for row in rows]

        ax.plot(
            layers, level(0.5), marker=("o", "s", "^", "D")[index % 4], markersize=4, color=color, label=plain(name)
        )
        ax.fill_between(layers, level(0.25), level(0.75), color=color, alpha=0.2, linewidth=0)
        mean = [float("nan") if value is None else value for value in results["mean"][index]]
        ax.plot(layers, mean, linestyle="--", color=color, linewidth=1)
    drawn = finite_values([results["quantiles"], results["mean"]])
    if (drawn > 0).any():
        ax.set_yscale("log")
    else:  # NaN inputs: nothing a log axis can show
        no_data_note(ax, "positive ratios")
    ax.set_xlabel("layer")
    ax.set_ylabel(r"$\|x\| \,/\, \|F(x)\|$")
    layer_ticks(ax, layers, axis="x", at_values=True)
    handles, labels = ax.get_legend_handles_labels()
    handles += [
        Line2D([], [], color="0.3", marker="o", markersize=4),
        Patch(color="0.3", alpha=0.2, linewidth=0),
        Line2D([], [], color="0.3", linestyle="--", linewidth=1),
    ]
    labels += ["median", "quartiles", "mean"]
    legend_below(fig, handles, labels, max_columns=3)
    ax.set_title(title)
    return finish(fig)


def where_read(results: dict[str, Any]) -> str:
    """Which token the ratios were read at, in words; and how the head pools, where the results say and it differs.

    The ratio is read at one token per sample (``token``: ``cls`` = position 0, ``last`` = the last real token),
    which is not always what the classifier reads: a mean-pooled ViT still has its class token at position 0.
    """
    token = results.get("token")
    where = {"cls": "read at token 0 ([CLS])", "last": "read at each sample's last real token"}.get(
        token, f"read at the {token} token"
    )
    pooling = results.get("pooling")
    if pooling and pooling != token:
        where += f"\n(the head reads the {'mean of the tokens' if pooling == 'mean' else pooling + ' token'})"
    return plain(where)
