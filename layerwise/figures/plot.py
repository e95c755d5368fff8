"""``layerwise plot``: render the paper-style figures of analysis summaries to PNG and PDF."""

from pathlib import Path
from typing import Optional

import matplotlib.pyplot as plt

from layerwise.figures.summary import summary_figures
from layerwise.results import load_summary, save_figure_atomic


def plot_summary(
    summary_file: Path, out_dir: Optional[Path] = None, formats: tuple[str, ...] = ("png", "pdf")
) -> list[Path]:
    """Write every figure of one summary; returns the written paths."""
    summary = load_summary(str(summary_file))
    target = out_dir or summary_file.parent / "figures"
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, figure in summary_figures(summary).items():
        for fmt in formats:
            path = target / f"{summary_file.stem}_{name}.{fmt}"
            save_figure_atomic(path, figure)
            written.append(path)
        plt.close(figure)
    return written
