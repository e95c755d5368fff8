"""The residual norm ratio per layer (App. B.2, Fig. 11-12 of Jiang et al.), from the summary's results."""

from typing import Any

from matplotlib.figure import Figure

from layerwise.figures.style import finite_values, new_figure, no_data_note


def norm_ratio_figure(results: dict[str, Any]) -> Figure:
    """||x|| / ||F(x)|| per layer: one line per branch (the median), its interquartile band, the mean dashed."""
    layers = results["layers"]
    levels = [round(float(level), 6) for level in results["quantile_levels"]]
    fig, ax = new_figure(5.4, 3.8)
    fig.subplots_adjust(bottom=0.3, top=0.86)
    for index, name in enumerate(results["branches"]):
        color = f"C{index}"
        rows = results["quantiles"][index]

        def level(q: float, rows: Any = rows) -> list[float]:
            return [float("nan") if row[levels.index(q)] is None else row[levels.index(q)] for row in rows]

        ax.plot(layers, level(0.5), marker="o", color=color, label=f"{name} (median)")
        ax.fill_between(layers, level(0.25), level(0.75), color=color, alpha=0.2, linewidth=0)
        mean = [float("nan") if value is None else value for value in results["mean"][index]]
        ax.plot(layers, mean, linestyle="--", color=color, linewidth=1)
    drawn = finite_values([results["quantiles"], results["mean"]])
    if (drawn > 0).any():
        ax.set_yscale("log")
    else:  # NaN inputs: nothing a log axis can show
        no_data_note(ax, "positive ratios")
    ax.set_xlabel("layer")
    ax.set_ylabel("||x|| / ||F(x)||")
    ax.set_xticks(layers if len(layers) <= 16 else layers[:: max(1, len(layers) // 12)])
    ax.set_title(
        f"residual norm ratio at the {results['token']} token (band: quartiles, dashed: mean)", fontsize="small"
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, fontsize="small", frameon=False)
    return fig
