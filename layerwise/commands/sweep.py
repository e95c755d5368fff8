"""``layerwise sweep``: the accuracy–speedup curve of confidence-threshold early exit, for one or several runs.

Every validation epoch, the analysis (``LogitLensMonitor`` / ``LayerwiseAnalysis``, option ``thresholds``) runs
early exit at each confidence threshold τ with the shared head (JSON key ``early_exit``) and, for ``MultiExit``
models, with the separate exit heads too (``exit_early_exit``). This command reads the latest validation summary of
each run and draws the curves on one figure: the shared-head curve of every run and, for multi-exit runs, their
separate-heads curve — the paper's comparison of one shared classifier with a classifier per layer.

Usage::

    layerwise sweep runs/cifar_aligned runs/cifar_multi_exit --labels aligned multi_exit --out sweep/

Each ``RUN_OR_JSON`` is a log directory (its latest ``layerwise/val_epoch_EEE_step_SSSSSSS.json`` is read) or a summary
JSON file. Writes ``sweep.md`` and ``sweep.csv`` (one row per curve and threshold: ``curve``, ``threshold``,
``accuracy``, ``speedup``; the CSV holds the JSON's numbers at full precision) and ``sweep.png``/``sweep.pdf``
(``--format`` picks the figure formats) in ``--out`` (default: the current folder). Curves are labelled
"<label> (shared head)" and "<label> (separate heads)"; labels default to the run folder names. Speedup is
``Σ_l L·m_l / Σ_l l·m_l`` with ``m_l`` the samples exiting at layer ``l`` (the heads' cost ignored).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from layerwise.commands._lazy import ANNOTATIONS_ONLY
from layerwise.figures.plot import FigureFormat

if ANNOTATIONS_ONLY:
    pass

HEADS = {"early_exit": "shared head", "exit_early_exit": "separate heads"}
_ARGUMENT = "RUN_OR_JSON"


@dataclass(frozen=True)
class Curve:
    """One accuracy–speedup curve: the early-exit rows of one head kind of one run, in threshold order."""

    label: str
    key: str
    rows: list[dict[str, Any]]

    @property
    def name(self) -> str:
        """The curve's legend and table label, e.g. ``"aligned (shared head)"``."""
        return f"{self.label} ({HEADS[self.key]})"


def run_label(path: Path) -> str:
    """A short name of the run a path belongs to: its log folder (``name/version_N`` for TensorBoard layouts)."""
    path = path.resolve()
    if path.is_file():
        path = path.parent.parent if path.parent.name == "layerwise" else path.with_suffix("")
    return f"{path.parent.name}/{path.name}" if path.name.startswith("version_") else path.name


def load_curves(summary_file: Path, label: str, option: str = _ARGUMENT) -> list[Curve]:
    """The shared-head curve of one summary, plus its separate-heads curve when it has one."""
    from layerwise.results import load_summary

    try:
        summary = load_summary(summary_file)  # the one schema: a file that does not fit is one line naming its key
    except OSError as error:
        raise ValueError(f"{option} {summary_file}: not a readable summary JSON ({error}).") from None
    if not summary.get("early_exit"):
        raise ValueError(
            f"{option} {summary_file}: the summary has no `early_exit`; validate with LogitLensMonitor or "
            "LayerwiseAnalysis (option `thresholds`)."
        )
    return [Curve(label, key, list(summary[key])) for key in HEADS if summary.get(key)]


def sweep_rows(curves: Sequence[Curve]) -> list[dict[str, Any]]:
    """One flat row per curve and threshold: ``curve``, ``threshold``, ``accuracy``, ``speedup`` (JSON values)."""
    return [
        {"curve": curve.name, "threshold": row["threshold"], "accuracy": row["accuracy"], "speedup": row["speedup"]}
        for curve in curves
        for row in curve.rows
    ]


def sweep_markdown(curves: Sequence[Curve]) -> str:
    """The rows of :func:`sweep_rows` as a markdown table (4 decimals)."""
    lines = ["| curve | threshold | accuracy | speedup |", "|---|---|---|---|"]
    for row in sweep_rows(curves):
        accuracy, speedup = (_cell(row[key], ".4f") for key in ("accuracy", "speedup"))
        lines.append(f"| {row['curve']} | {row['threshold']:g} | {accuracy} | {speedup} |")
    return "\n".join(lines) + "\n"


def sweep_csv(curves: Sequence[Curve]) -> str:
    """The rows of :func:`sweep_rows` as CSV, floats at full precision (``repr``)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["curve", "threshold", "accuracy", "speedup"])
    for row in sweep_rows(curves):
        writer.writerow([row["curve"], *(_cell(row[key], "r") for key in ("threshold", "accuracy", "speedup"))])
    return buffer.getvalue()


def _cell(value: Any, spec: str) -> str:
    """A number of a row as text (``r``: ``repr`` at full precision); an undefined one (null) as ``nan``."""
    number = float("nan") if value is None else float(value)
    return repr(number) if spec == "r" else format(number, spec)


def write_sweep(curves: Sequence[Curve], out_dir: Path, formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """Write ``sweep.md``, ``sweep.csv`` and ``sweep.<format>`` for every format; returns the written paths."""
    import matplotlib.pyplot as plt

    from layerwise.figures.sweep import sweep_figure
    from layerwise.results import save_figure_atomic, write_text_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "sweep.md", out_dir / "sweep.csv"]
    write_text_atomic(written[0], sweep_markdown(curves))
    write_text_atomic(written[1], sweep_csv(curves))
    figure = sweep_figure(curves)
    try:
        for fmt in formats:
            path = out_dir / f"sweep.{fmt}"
            save_figure_atomic(path, figure)
            written.append(path)
    finally:
        plt.close(figure)
    return written


# ------------------------------------------------------------------------------- the `layerwise sweep` command
def sweep(
    runs: list[Path],
    labels: Optional[list[str]] = None,
    out: Path = Path("."),
    format: list[FigureFormat] = None,  # noqa: A002
) -> None:
    """Accuracy against speedup of confidence-threshold early exit, from the latest validation summary of each run.

    The shared head of every run, and the separate exit heads of multi-exit runs; writes sweep.md, sweep.csv and
    the figure.

    Args:
        runs: log directories or summary JSON files (RUN_OR_JSON).
        labels: one name per run (default: the run folder names).
        out: output folder.
        format: figure formats (default png pdf).
    """
    from layerwise.results import latest_summary

    if labels is not None and len(labels) != len(runs):
        raise ValueError(f"`--labels` has {len(labels)} names for {len(runs)} RUN_OR_JSON paths; give one each.")
    files = [latest_summary(path, "RUN_OR_JSON") for path in runs]
    for path, summary_file in zip(runs, files):
        print(f"layerwise sweep: {path} -> {summary_file}")
    from layerwise.figures.plot import warnings_as_lines

    with warnings_as_lines("layerwise sweep"):  # a summary of a newer layerwise: one line
        curves = [
            curve
            for summary_file, label in zip(files, labels or [run_label(path) for path in runs])
            for curve in load_curves(summary_file, label)
        ]
    print(sweep_markdown(curves), end="")
    for written in write_sweep(curves, out, format or ("png", "pdf")):
        print(written)
