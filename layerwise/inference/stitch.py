"""A stitching sweep over a grid of layer pairs (``layerwise stitch``): one ``Stitched`` fit and validation each."""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from torch import nn


def parse_pairs(layers: Optional[Sequence[int]], pairs: Optional[Sequence[str]], depth_a: int, depth_b: int) -> list:
    """The (l, m) pairs: ``pairs`` as "l:m" strings, else (l, l) for ``layers`` (default 1..min(L_A, L_B) - 1)."""
    if pairs:
        out = []
        for text in pairs:
            left, sep, right = str(text).partition(":")
            if not sep or not left.strip().isdigit() or not right.strip().isdigit():
                raise ValueError(f"`--pairs` holds {text!r}: write each pair as l:m, e.g. 2:3.")
            out.append((int(left), int(right)))
    else:
        out = [(layer, layer) for layer in (layers or range(1, min(depth_a, depth_b)))]
    for l_a, m_b in out:
        if not 0 <= l_a <= depth_a or not 0 <= m_b < depth_b:
            raise ValueError(
                f"`--pairs`/`--layers`: ({l_a}, {m_b}) needs 0 <= l <= {depth_a} (A's blocks) and 0 <= m < {depth_b}."
            )
    return out


def stitch_sweep(
    model_a: nn.Module,
    model_b: nn.Module,
    pairs: Sequence[tuple[int, int]],
    train_loader: Any,
    val_loader: Any,
    module_options: dict[str, Any],
    trainer_options: dict[str, Any],
    report: Any = print,
) -> list[dict[str, Any]]:
    """Fit and validate one stitched model per pair; one row of held-out losses and penalties per pair."""
    import lightning.pytorch as pl

    from layerwise.lightning_modules.stitched import Stitched

    rows = []
    for l_a, m_b in pairs:
        module = Stitched(model_a, model_b, l_a, m_b, **module_options)
        trainer = pl.Trainer(**trainer_options)
        if module.phi.linear is not None:
            with warnings.catch_warnings():  # validation runs after fit, on purpose: not a missing loader
                warnings.filterwarnings("ignore", message=".*but have no `val_dataloader`")
                trainer.fit(module, train_loader)
        values = trainer.validate(module, val_loader, verbose=False)[0]
        row = {"layer_a": l_a, "layer_b": m_b, **{key.split("/", 1)[1]: float(v) for key, v in values.items()}}
        rows.append(row)
        report(f"l={l_a} m={m_b}: penalty vs B {row['penalty_b']:+.4f} nats/token, vs A {row['penalty_a']:+.4f}")
    return rows


def stitch_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The penalty table, one row per (l, m)."""
    keys = [key for key in ("loss_stitched", "loss_a", "loss_b", "penalty_b", "penalty_a") if key in rows[0]]
    lines = ["| l (A) | m (B) | " + " | ".join(keys) + " |", "|" + "---|" * (2 + len(keys))]
    for row in rows:
        lines.append(f"| {row['layer_a']} | {row['layer_b']} | " + " | ".join(f"{row[k]:.4f}" for k in keys) + " |")
    return "\n".join(lines) + "\n"


def write_stitch(rows: Sequence[dict[str, Any]], record: dict[str, Any], out: Path) -> list[Path]:
    """``stitch.json``, ``stitch.md`` and ``stitch.png`` (the penalty against B per pair) in ``out``."""
    import matplotlib.pyplot as plt

    from layerwise.figures.summary import _figure
    from layerwise.results import save_figure_atomic, write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    paths = [
        write_text_atomic(out / "stitch.json", json.dumps({**record, "rows": list(rows)}, indent=1) + "\n"),
        write_text_atomic(out / "stitch.md", stitch_markdown(rows)),
    ]
    fig, ax = _figure(5.4, 3.8)
    labels = [f"{row['layer_a']}→{row['layer_b']}" for row in rows]
    ax.plot(range(len(rows)), [row["penalty_b"] for row in rows], "o-", label="vs B")
    ax.plot(range(len(rows)), [row["penalty_a"] for row in rows], "s--", label="vs A")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(rows)), labels)
    ax.set_xlabel("stitched after block l of A → into block m+1 of B")
    ax.set_ylabel("stitching penalty (nats / token)")
    ax.legend(loc="best", fontsize="small")
    ax.set_title(f"Stitching penalty ({record.get('phi', 'learned')} φ, held-out)", fontsize="medium")
    try:
        paths.append(save_figure_atomic(out / "stitch.png", fig))
    finally:
        plt.close(fig)
    return paths
