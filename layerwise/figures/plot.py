"""``layerwise plot``: render the paper-style figures of analysis summaries to PNG and PDF."""

import argparse
from pathlib import Path
from typing import Optional

import matplotlib.pyplot as plt

from layerwise.figures.summary import summary_figures
from layerwise.results import find_summaries, load_summary


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
            figure.savefig(path, dpi=150)
            written.append(path)
        plt.close(figure)
    return written


def main(argv: Optional[list[str]] = None) -> None:
    """Command-line entry: ``layerwise plot <summary.json | log dir> [--out DIR] [--all-epochs]``."""
    parser = argparse.ArgumentParser(
        prog="layerwise plot",
        description="Render COS/CKA heatmaps, similarity-to-last with accuracy, the saturation histogram, exits per "
        "layer and the ε-effective depth from layerwise summaries.",
    )
    parser.add_argument("path", type=Path, help="a val_epoch_EEE.json file, or a log directory to search")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <json folder>/figures)")
    parser.add_argument("--all-epochs", action="store_true", help="plot every epoch, not only the latest")
    parser.add_argument("--format", action="append", choices=["png", "pdf", "svg"], help="repeatable; png and pdf")
    args = parser.parse_args(argv)
    formats = tuple(args.format or ("png", "pdf"))
    try:
        files = find_summaries(args.path, args.all_epochs)
    except FileNotFoundError as error:
        parser.error(str(error))
    for summary_file in files:
        for path in plot_summary(summary_file, args.out, formats):
            print(path)
