"""``layerwise plot``: render the paper-style figures of analysis summaries to PNG and PDF."""

import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, Optional

from layerwise.figures.files import DEFAULT_DPI, write_figures
from layerwise.results import find_summaries, is_pattern, is_summary, load_summary, summary_order

FigureFormat = Literal["png", "pdf", "svg"]


PrintWidth = Literal["column", "page"]  # figures/style.py's PRINTS: 3.3 and 6.9 inches


@contextmanager
def warnings_as_lines(prog: str) -> Iterator[None]:
    """The package's warnings while a command draws (a figure function skipped, a newer file), one line each."""
    from layerwise.errors import LayerwiseWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LayerwiseWarning)
        try:
            yield
        finally:
            for warning in caught:
                if issubclass(warning.category, LayerwiseWarning):
                    text = " ".join(str(warning.message).split()).removeprefix("layerwise: ")
                    print(f"{prog}: {text}", file=sys.stderr)
                else:
                    warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def plot_summary(
    summary_file: Path,
    out_dir: Optional[Path] = None,
    formats: tuple[str, ...] = ("png", "pdf"),
    width: PrintWidth = "page",
    dpi: int = DEFAULT_DPI,
    titles: bool = True,
    functions: Sequence[Any] = (),
) -> list[Path]:
    """Write every figure of one summary, drawn at print ``width``; returns the written paths.

    ``functions``: figure functions besides the registered ones (:mod:`layerwise.figures.registry`).
    """
    from layerwise.figures.style import drawn_at  # here, not at the top: `plot --help` answers without matplotlib
    from layerwise.figures.summary import summary_figures

    summary = load_summary(summary_file)
    target = out_dir or summary_file.parent / "figures"
    target.mkdir(parents=True, exist_ok=True)
    with drawn_at(width):
        figures = summary_figures(summary, functions, where=str(summary_file))
    return write_figures(figures, target, summary_file.stem, formats, dpi, titles)


# ------------------------------------------------------------------------------- the `layerwise plot` command
def plot(
    path: list[Path],
    out: Optional[Path] = None,
    all_epochs: bool = False,
    format: list[FigureFormat] = None,  # noqa: A002
    label: Optional[list[str]] = None,
    epoch: str = "last",
    width: PrintWidth = "page",
    no_title: bool = False,
    dpi: int = DEFAULT_DPI,
    panels: Optional[str] = None,
    figures: Optional[list[str]] = None,
) -> None:
    """Render the paper-style figures of layerwise summaries to PNG/PDF/SVG.

    COS/CKA heatmaps, similarity to the last layer with the accuracy per layer, the saturation histogram, early exit
    (threshold × exit layer) and the ε-effective depth. Several runs (folders or globs) are drawn side by side
    instead: one figure per quantity (accuracy, COS and CKA to the last layer, NC1, ε-effective depth, early exit), a
    line per group of runs that differ only by seed, its band the 95 % t-interval over the seeds, and the same
    numbers in comparison.csv and comparison.md.

    Args:
        path: a summary JSON, a run folder, or a folder of runs (``runs/quickstart``): then its latest fit run, the
            one whose summary was written last (evaluations by validate/test, in their run's sub-folders, only when
            there is no fit run; name a run's folder to draw another). Several paths or a glob (``'runs/modes/*'``):
            those runs side by side.
        out: output folder (default: <json folder>/figures; for several runs: ./comparison).
        all_epochs: plot every epoch, not only the latest (one run).
        format: figure formats (default png pdf).
        label: several runs: a label per run, or per path (a glob's runs share it); runs sharing a label form one
            group (default: what differs between the runs' configs: the model class, the backbone, ...).
        epoch: the epoch every run is drawn at: last (the latest every run has), best:<key> (the best mean of a
            summary key over the runs, at the last layer: best:accuracy; lowest for a loss), or a number.
        width: print width the figures are drawn at, natively, every text >= 7 pt: a journal's column (3.3 in) or
            page (6.9 in).
        no_title: leave the titles off the figures (the caption says it): what they named (run, stage, epoch) goes
            into each file's metadata and a sidecar <figure>.json.
        dpi: resolution of the PNG files (journals ask 300-600).
        panels: several quantities in one figure, panels (a), (b), ... at the print width, e.g.
            accuracy,cos,cka,nc1 (also effective_depth): comparison_panels.<format> beside the other figures (one or
            several runs).
        figures: figure functions of your own analyses, as module:function (e.g. feature_norm:feature_norm_figures),
            that may draw the summaries that name them, besides the package's and those registered in the
            entry-point group layerwise.figures; a summary naming any other function draws it not (docs/security.md).
    """
    from layerwise.figures.registry import typed_functions

    functions = typed_functions(figures or [])
    formats = tuple(format or ("png", "pdf"))
    if dpi < 50 or dpi > 2400:
        raise ValueError(f"`--dpi={dpi}`: give a resolution between 50 and 2400 dots per inch (journals ask 300-600).")
    path = [Path(path)] if isinstance(path, (str, Path)) else [Path(p) for p in path]  # one path, from Python
    chosen = [name.strip() for name in panels.split(",") if name.strip()] if panels else None
    if panels is not None and not chosen:
        raise ValueError("`--panels=`: name the quantities, e.g. --panels accuracy,cos,cka,nc1.")
    if len(path) > 1 or is_pattern(path[0]) or chosen:
        if all_epochs:
            raise ValueError("`--all_epochs` draws one run; several runs are drawn at one epoch (--epoch).")
        with warnings_as_lines("layerwise plot"):
            _plot_runs(path, out, formats, label, epoch, width, not no_title, dpi, chosen)
        return
    if label is not None:
        raise ValueError("`--label` names several runs; give more than one run to draw them side by side.")
    files = find_summaries(path[0], all_epochs, option="path")
    if path[0].is_dir():
        run = files[0].parent.parent
        runs = {p.parent for p in path[0].rglob("*_epoch_*.json") if is_summary(p)}
        many = len(runs) > 1 and run != path[0]
        latest = f" (the latest fit run of the {len(runs)} runs under {path[0]})" if many else ""
        print(f"layerwise plot: drawing run {run}{latest}")
    if epoch != "last":
        with warnings_as_lines("layerwise plot"):
            files = _at_epoch(files[0].parent.parent, epoch)
    for summary_file in files:
        with warnings_as_lines("layerwise plot"):
            written_files = plot_summary(summary_file, out, formats, width, dpi, not no_title, functions)
        for written in written_files:
            print(written)


def _at_epoch(run: Path, epoch: str) -> list[Path]:
    """Every stage's summary of ``run`` at the epoch ``--epoch`` picks (its latest validation in that epoch)."""
    from layerwise.figures.seeds import choose_epoch
    from layerwise.results import run_summaries

    chosen, _ = choose_epoch([run_summaries(run)], [str(run)], epoch)
    files = find_summaries(run, all_epochs=True, option="path")
    stages = sorted({p.name.split("_epoch_")[0] for p in files})
    at = [[p for p in files if p.name.startswith(f"{stage}_epoch_{chosen:03d}_")] for stage in stages]
    return [max(found, key=summary_order) for found in at if found]


def _plot_runs(
    paths: list[Path],
    out: Optional[Path],
    formats: tuple[str, ...],
    labels: Optional[list[str]],
    epoch: str,
    width: PrintWidth,
    titles: bool = True,
    dpi: int = DEFAULT_DPI,
    panels: Optional[list[str]] = None,
) -> None:
    """Several runs side by side (:mod:`layerwise.figures.overlay`), drawn at print ``width``."""
    from layerwise.figures.overlay import load_comparison, write_comparison

    comparison = load_comparison(paths, labels, epoch)
    groups = "; ".join(comparison.legend(group.label) for group in comparison.groups)
    print(f"layerwise plot: {len(comparison.runs)} runs at epoch {comparison.epoch} ({comparison.how}): {groups}")
    for written in write_comparison(comparison, out or Path("comparison"), formats, width, dpi, titles, panels):
        print(written)
