"""``layerwise plot``: render the paper-style figures of analysis summaries to PNG and PDF."""

from pathlib import Path
from typing import Literal, Optional

from layerwise.results import find_summaries, is_summary, load_summary, save_figure_atomic

FigureFormat = Literal["png", "pdf", "svg"]


PrintWidth = Literal["column", "page"]  # figures/style.py's PRINTS: 3.3 and 6.9 inches


def plot_summary(
    summary_file: Path,
    out_dir: Optional[Path] = None,
    formats: tuple[str, ...] = ("png", "pdf"),
    width: PrintWidth = "page",
) -> list[Path]:
    """Write every figure of one summary, drawn at print ``width``; returns the written paths."""
    import matplotlib.pyplot as plt  # here, not at the top: `layerwise plot --help` answers without matplotlib

    from layerwise.figures.style import drawn_at
    from layerwise.figures.summary import summary_figures

    summary = load_summary(str(summary_file))
    target = out_dir or summary_file.parent / "figures"
    target.mkdir(parents=True, exist_ok=True)
    written = []
    with drawn_at(width):
        figures = summary_figures(summary)
    for name, figure in figures.items():
        for fmt in formats:
            path = target / f"{summary_file.stem}_{name}.{fmt}"
            save_figure_atomic(path, figure)
            written.append(path)
        plt.close(figure)
    return written


# ------------------------------------------------------------------------------- the `layerwise plot` command
def plot(
    path: Path,
    out: Optional[Path] = None,
    all_epochs: bool = False,
    format: list[FigureFormat] = None,  # noqa: A002
    width: PrintWidth = "page",
) -> None:
    """Render the paper-style figures of layerwise summaries to PNG/PDF/SVG.

    COS/CKA heatmaps, similarity to the last layer with the accuracy per layer, the saturation histogram, early exit
    (threshold × exit layer) and the ε-effective depth.

    Args:
        path: a summary JSON, a run folder, or a folder of runs (``runs/quickstart``): then its latest fit run, the
            one whose summary was written last (evaluations by validate/test, in their run's sub-folders, only when
            there is no fit run; name a run's folder to draw another).
        out: output folder (default: <json folder>/figures).
        all_epochs: plot every epoch, not only the latest.
        format: figure formats (default png pdf).
        width: print width the figures are drawn at, natively, every text >= 7 pt: a journal's column (3.3 in) or
            page (6.9 in).
    """
    files = find_summaries(path, all_epochs, option="path")
    if path.is_dir():
        run = files[0].parent.parent
        runs = {p.parent for p in path.rglob("*_epoch_*.json") if is_summary(p)}
        latest = f" (the latest fit run of the {len(runs)} runs under {path})" if len(runs) > 1 and run != path else ""
        print(f"layerwise plot: drawing run {run}{latest}")
    for summary_file in files:
        for written in plot_summary(summary_file, out, tuple(format or ("png", "pdf")), width):
            print(written)
