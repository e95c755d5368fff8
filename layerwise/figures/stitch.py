"""The stitching figure: the penalty (or accuracy drop) of every stitched layer pair against B and against A."""

from collections.abc import Sequence
from typing import Any

from layerwise.figures.style import Figure, finish, layer_ticks, legend_below, new_figure


def stitch_figure(rows: Sequence[dict[str, Any]], record: dict[str, Any]) -> Figure:
    """One point per pair ``l→m``; classifiers in accuracy points (MNLI and HANS), language models in nats/token."""
    fig, ax = new_figure(5.4, 3.8)
    labels = [f"{row['layer_a']}→{row['layer_b']}" for row in rows]
    classifier = "acc_drop_b" in rows[0]  # classifiers: accuracy drops in points (HANS's too), else nats per token
    task = f"{str(record.get('glue_task', '')).upper()} " if record.get("glue_task") else ""
    series = [("acc_drop", task, "accuracy drop (points)")] if classifier else [("penalty", "", "nats / token")]
    if classifier and "hans_acc_drop_b" in rows[0]:
        series.append(("hans_acc_drop", "HANS ", ""))
    scale = 100.0 if classifier else 1.0
    for key, name, _ in series:
        ax.plot(range(len(rows)), [scale * row[f"{key}_b"] for row in rows], "o-", label=f"{name}vs B")
        ax.plot(range(len(rows)), [scale * row[f"{key}_a"] for row in rows], "s--", label=f"{name}vs A")
    ax.axhline(0.0, color="grey", lw=0.8)
    layer_ticks(ax, labels, axis="x", most=8)  # pairs "l→m" are wider than layer numbers
    ax.set_xlabel("stitched after block l of A → into block m+1 of B")
    ax.set_ylabel(f"stitching penalty ({series[0][2]})")
    legend_below(fig, *ax.get_legend_handles_labels())
    ax.set_title(f"stitching penalty ({record.get('phi', 'learned')} φ, held-out)")
    return finish(fig)
