"""A stitching sweep over a grid of layer pairs (``layerwise stitch``): one ``Stitched`` fit and validation each."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
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
    extra: Optional[Mapping[str, Any]] = None,
) -> list[dict[str, Any]]:
    """Fit and validate one stitched model per pair; one row of held-out losses and penalties per pair.

    ``extra``: more evaluation datamodules by name (e.g. ``{"hans": HANSDataModule(...)}``), each validated after
    the main held-out data, its values in the row as ``<name>_<key>`` (its ``label_groups`` applied).
    """
    import lightning.pytorch as pl

    from layerwise.lightning_modules.stitched import Stitched

    rows = []
    for l_a, m_b in pairs:
        module = Stitched(model_a, model_b, l_a, m_b, **module_options)
        trainer = pl.Trainer(**trainer_options)
        if module.phi.linear is not None:
            if train_loader is None:
                raise ValueError("A learned phi needs training data: give the training split (or use --phi identity).")
            with warnings.catch_warnings():  # validation runs after fit, on purpose: not a missing loader
                warnings.filterwarnings("ignore", message=".*but have no `val_dataloader`")
                trainer.fit(module, train_loader)
        values = trainer.validate(module, val_loader, verbose=False)[0]
        row = {"layer_a": l_a, "layer_b": m_b, **{key.split("/", 1)[1]: float(v) for key, v in values.items()}}
        for name, datamodule in (extra or {}).items():
            values = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
            row.update({f"{name}_{key.split('/', 1)[1]}": float(v) for key, v in values.items()})
        rows.append(row)
        line = f"l={l_a} m={m_b}: penalty vs B {row['penalty_b']:+.4f} nats, vs A {row['penalty_a']:+.4f}"
        if "acc_drop_b" in row:
            line += f"; accuracy drop vs B {100 * row['acc_drop_b']:+.2f} points, vs A {100 * row['acc_drop_a']:+.2f}"
        report(line)
    return rows


def stitch_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The penalty table, one row per (l, m): losses and penalties, then accuracies for classifiers."""
    keys = [key for key in rows[0] if key not in ("layer_a", "layer_b")]
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
    ax.set_xticks(range(len(rows)), labels)
    ax.set_xlabel("stitched after block l of A → into block m+1 of B")
    ax.set_ylabel(f"stitching penalty ({series[0][2]})")
    ax.legend(loc="best", fontsize="small")
    ax.set_title(f"Stitching penalty ({record.get('phi', 'learned')} φ, held-out)", fontsize="medium")
    try:
        paths.append(save_figure_atomic(out / "stitch.png", fig))
    finally:
        plt.close(fig)
    return paths
