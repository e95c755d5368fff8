"""The one style of every layerwise figure: canvas, margins, fonts, colours, ticks, legends, labels and titles.

Every module of ``figures/`` draws through these helpers (and nothing of another figure module's), so fonts,
margins, layer ticks, legends and the note for missing data look the same in TensorBoard, ``layerwise plot``, the
report and the commands' figures:

- print size: every figure is drawn natively at a journal's column (3.3 in) or page (6.9 in) width
  (:data:`PRINTS`, chosen with :func:`drawn_at`; page by default), with its text sizes for that width, none under
  7 pt: title >= axis label >= tick label = legend >= note (:func:`sizes`), applied by :func:`finish` to every title,
  axis label, tick label and legend of a figure;
- margins in inches (:func:`new_figure`), not in fractions of the canvas, so that a small or a large figure keeps
  room for its labels; no constrained layout (a third more drawing time at every epoch);
- words, not keys: stages named in words (:func:`stage_name`: ``val_corrupted`` is "validation (corrupted)");
- one colour per layer (:func:`layer_colour`, the same layer has the same colour in every figure of a run): an
  ordered map (cividis without its pale end), the layers' order kept in greyscale; one colour per quantity
  (:data:`QUANTITY_COLOURS`: accuracy, COS, CKA, NC1..., the same in the figures, the report and TensorBoard's
  images) and per named series (:func:`series_colour`: residual branches, models); other series in
  :data:`SERIES_PALETTE` (matplotlib's default cycle too); ordered series (thresholds) told apart by colour and by
  marker (:func:`ordered_style`); groups of runs by colour, marker and dash (:func:`group_style`), so that they
  differ in greyscale;
- titles can come off (:func:`untitled`, ``plot --no_title``) into the files' metadata (:func:`provenance_metadata`);
  multi-panel figures get bold panel letters (:func:`panel_letter`); every file records :data:`STYLE_VERSION`;
- similarity maps (:func:`similarity_map`): COS, a signed quantity, on a diverging map centred at 0 over [-1, 1] when
  a value is negative (else sequential over [0, 1]); CKA sequential; the colour bar says in words what it shows;
- fonts embedded in PDF and PostScript as TrueType (``pdf.fonttype`` 42), not as Type 3 fonts, which many
  publishers refuse;
- legends either inside the axes when short (:func:`legend_inside`) or in a band below the axes that is measured, not
  guessed (:func:`legend_below`); never on the right of the canvas;
- titles: what the figure shows, and on a second line which run and validation it belongs to (:func:`stamp`,
  :func:`run_line`), so that an image copied out of TensorBoard still says where it came from;
- labels beside points placed where they overlap no other label (:func:`place_labels`);
- lines labelled directly at their right ends, in their colours, where the ends are far enough apart for the labels
  and the labels take at most 30 % of the axes' width (:func:`direct_labels`); elsewhere the legend names them.
"""

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

# TrueType (Type 42) fonts in every PDF and PostScript file, as publishers ask, instead of matplotlib's Type 3 default
matplotlib.rcParams["pdf.fonttype"] = 42
matplotlib.rcParams["ps.fonttype"] = 42

__all__ = [
    "DIRECT_LABEL",
    "MIN_TEXT_SIZE",
    "PRINTS",
    "QUANTITY_COLOURS",
    "SERIES_PALETTE",
    "STYLE_VERSION",
    "Figure",
    "FigureCanvasAgg",
    "Print",
    "Width",
    "cell_values",
    "colorbar",
    "direct_labels",
    "dodge",
    "drawn_at",
    "finish",
    "finite_values",
    "group_style",
    "panel_letter",
    "provenance_metadata",
    "untitled",
    "fit_to_cells",
    "layer_colour",
    "layer_ticks",
    "legend_below",
    "legend_inside",
    "new_figure",
    "no_data_note",
    "ordered_colour",
    "ordered_style",
    "place_labels",
    "plt",
    "run_line",
    "quantity_colour",
    "series_colour",
    "set_margins",
    "similarity_map",
    "sizes",
    "stage_name",
    "stamp",
]


# The style's version: raised whenever a change here changes how a figure looks. Every figure file layerwise writes
# records it (PNG text, PDF keywords, the --no-title sidecar), and tests/project/test_docs_figures.py fails when a
# picture in docs/figures/ records an older one than this: the docs show figures in the current style.
STYLE_VERSION = 2


@dataclass(frozen=True)
class Print:
    """A print width (inches) with its text sizes (points, none under 7) and margins (inches) for that width."""

    width: float
    title: float
    label: float
    tick: float
    legend: float
    note: float
    # margins: room for tick labels and an axis label on the left and below, for a title line above, and for a
    # right-hand axis or a colorbar label on the right
    left: float
    bottom: float
    right: float
    right_axis: float
    colorbar: float
    title_line: float


# The two widths a journal prints a figure at, and nothing else: every figure is drawn natively at one of them
PRINTS = {
    "column": Print(3.3, 8, 7.5, 7, 7, 7, 0.6, 0.42, 0.12, 0.6, 0.62, 0.16),
    "page": Print(6.9, 10, 9, 8, 8, 7, 0.72, 0.52, 0.2, 0.75, 0.7, 0.2),
}
Width = Literal["column", "page"]
MIN_TEXT_SIZE = 7  # points: the smallest text a journal prints
_WIDTH: ContextVar[str] = ContextVar("layerwise_print_width", default="page")


@contextmanager
def drawn_at(width: str) -> Iterator[Print]:
    """Draw the figures made inside the ``with`` block at print ``width`` (``column`` or ``page``, see :data:`PRINTS`).

    A context variable, so that a figure function's signature need not carry it (page when none is set).
    """
    if width not in PRINTS:
        raise ValueError(f"`--width={width}`: choose column (3.3 in) or page (6.9 in).")
    token = _WIDTH.set(width)
    try:
        yield PRINTS[width]
    finally:
        _WIDTH.reset(token)


def sizes() -> Print:
    """The print width, text sizes and margins figures are drawn with now (:func:`drawn_at`)."""
    return PRINTS[_WIDTH.get()]


# One colour per layer, from an ordered map, because the layer is an ordered quantity: cividis (designed to read the
# same for colour-blind readers, its lightness rising steadily) from dark blue (layer 1) to olive-yellow (the last
# layer), without its pale yellow end (contrast with white >= 2, so a line is never faint). Lightness grows with the
# layer, so that layers stay in order in greyscale too. tests/figures/test_figures.py measures it.
_LAYER_MAP, _LAYER_END = "cividis", 0.8
# ordered series (thresholds): plasma from dark blue to orange (its pale yellow end left out), sampled at equal
# colour distances rather than equal steps of the map, whose dark end changes slowly (two thresholds there looked
# the same dark purple)
_ORDERED_MAP, _ORDERED_END = "plasma", 0.8
_ORDERED_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")

# One colour per quantity, wherever it is drawn (the figures, the report's charts, TensorBoard's images): Okabe & Ito's
# and Paul Tol's colours, those drawn together (COS, CKA, accuracy) >= 57 apart in CIELAB for any colour vision (the
# report's tab10 blue, orange and green had an orange-green pair a deuteranope barely tells apart)
QUANTITY_COLOURS = {
    "accuracy": "#000000",  # black
    "cos": "#0072B2",  # blue (Okabe-Ito)
    "cka": "#E69F00",  # orange (Okabe-Ito)
    "nc1": "#CC79A7",  # reddish purple (Okabe-Ito)
    "kl_to_final": "#117733",  # green (Tol muted): the lens's distance from the final distribution
    "loss": "#332288",  # indigo (Tol muted)
    "perplexity": "#44AA99",  # teal (Tol muted)
    "f1": "#999933",  # olive (Tol muted)
    "exit_accuracy": "#882255",  # wine (Tol muted): the separate heads' accuracy
    "negative": "#D55E00",  # vermillion (Okabe-Ito): the samples with a negative COS
    "saturation": "#555555",  # dark grey
}
# series without a colour of their own (runs of a sweep, evaluation stages, stitching directions), in this order;
# matplotlib's default colour cycle too, so that no figure falls back on tab10's orange-green pair
SERIES_PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#882255")
matplotlib.rcParams["axes.prop_cycle"] = matplotlib.cycler(color=list(SERIES_PALETTE))
_SERIES = {
    **QUANTITY_COLOURS,
    "block": "#0072B2",
    "attention": "#E69F00",
    "mlp": "#882255",  # wine: tab:green and tab:orange look alike to a deuteranope (ΔE 5), this is >= 32 from both
    "model a": "#0072B2",
    "model b": "#E69F00",
}
# similarity maps: COS is signed (a diverging map centred at 0 when a value is negative), CKA is not
SIMILARITY_LABELS = {
    "cos": "mean cosine similarity",
    "cka": "linear CKA",
    "debiased_cka": "debiased linear CKA",
    "cca": "mean canonical correlation",
    "svcca": "SVCCA (mean canonical correlation)",
    "pwcca": "PWCCA (weighted canonical correlation)",
    "procrustes": "Procrustes distance",
    "shape": "angular shape distance (rad)",
    "mutual_knn": "mutual k-NN alignment",
    "cknna": "CKNNA (k-NN centred kernel alignment)",
}
# the range of a measure that is not a similarity in [0, 1]: the distances (0 = the same representation)
SIMILARITY_RANGES = {"procrustes": (0.0, math.sqrt(2.0)), "shape": (0.0, math.pi / 2)}
_DIVERGING_MAP, _SEQUENTIAL_MAP = "RdBu_r", "viridis"
STAGE_NAMES = {"val": "validation", "test": "test", "train": "training", "predict": "prediction"}


def new_figure(
    width: float,
    height: float,
    right_axis: bool = False,
    title_lines: int = 1,
    right: Optional[float] = None,
    colorbar: bool = False,
    height_ratios: Optional[Sequence[float]] = None,
) -> tuple[Figure, Any]:
    """One axes on a canvas of the print width (:func:`sizes`), with margins in inches (see the module's docstring).

    ``width`` x ``height`` is the figure's proportion as designed (inches on a screen); the canvas is as wide as the
    print width and ``height`` * sqrt(print width / ``width``) high: a page-wide figure is not twice as high as a
    column-wide one, whose text is nearly as large.

    With ``height_ratios``, a column of axes of those relative heights sharing the x axis (their list is returned):
    quantities on different scales each on their own axes, never on a twin axis over the same area.

    Args:
        width: the designed width in inches (sets the proportion only).
        height: the designed height in inches.
        right_axis: leave room on the right for a twin axis' ticks and label.
        colorbar: a narrow axes on the right for a colorbar (:func:`colorbar` draws it there), and room for its
            ticks and label.
        title_lines: lines of title to leave room for above the axes (:func:`stamp` adds a line's room itself).
        right: the right margin in inches, overriding ``right_axis``.
        height_ratios: relative heights of a column of axes that share the x axis, top first.
    """
    print_width = sizes().width
    fig = Figure(figsize=(print_width, height * math.sqrt(print_width / width)))
    FigureCanvasAgg(fig)  # no pyplot: figures may be drawn off the training loop, in a worker thread
    if height_ratios:
        ax = list(fig.subplots(len(height_ratios), 1, sharex=True, height_ratios=height_ratios))
        fig.subplots_adjust(hspace=0.12)
    elif colorbar:  # the bar in a column of its own, 0.1 in wide, 0.08 in from the axes, as high as they are
        region, bar, gap = print_width - sizes().left - sizes().colorbar, 0.1, 0.08
        ax, fig._layerwise_colorbar = fig.subplots(
            1, 2, gridspec_kw={"width_ratios": [region - bar - gap, bar], "wspace": 2 * gap / (region - gap)}
        )
    else:
        ax = fig.subplots()
    p = sizes()
    margin_right = right if right is not None else (p.right_axis if right_axis else p.colorbar if colorbar else p.right)
    set_margins(fig, left=p.left, right=margin_right, bottom=p.bottom, top=0.1 + p.title_line * title_lines)
    return fig, ax


def set_margins(fig: Figure, **inches: float) -> None:
    """Margins of the subplot area in inches (``left``, ``right``, ``bottom``, ``top``), at most 45 % of the canvas.

    The margins are kept on the figure, so that a canvas that grows (:func:`legend_below`) keeps them in inches.
    """
    margins = {**getattr(fig, "_layerwise_margins", {}), **inches}
    fig._layerwise_margins = margins
    width, height = fig.get_size_inches()
    scale = {"left": width, "right": width, "bottom": height, "top": height}
    fractions = {side: min(0.45, value / scale[side]) for side, value in margins.items()}
    for side in ("right", "top"):
        if side in fractions:
            fractions[side] = 1.0 - fractions[side]
    fig.subplots_adjust(**fractions)


def finish(fig: Figure) -> Figure:
    """Give every title, axis label, tick label and legend of ``fig`` the house sizes; returns ``fig``."""
    for ax in fig.axes:
        for title in (ax.title, ax._left_title, ax._right_title):
            title.set_fontsize(sizes().title)
        ax.xaxis.label.set_fontsize(sizes().label)
        ax.yaxis.label.set_fontsize(sizes().label)
        ax.tick_params(labelsize=sizes().tick)
        for offset in (ax.xaxis.get_offset_text(), ax.yaxis.get_offset_text()):
            offset.set_fontsize(sizes().tick)
        if ax.get_legend() is not None:
            for text in ax.get_legend().get_texts():
                text.set_fontsize(sizes().legend)
    for legend in fig.legends:
        for text in legend.get_texts():
            text.set_fontsize(sizes().legend)
    if fig._suptitle is not None:
        fig._suptitle.set_fontsize(sizes().title)
    return fig


def layer_colour(layer: int, depth: int) -> Any:
    """The colour of layer ``layer`` (1-based) of a ``depth``-layer model: the same in every figure of that model.

    An ordered map (cividis, dark blue at layer 1 to olive-yellow at layer ``depth``): the layer is ordered, and its
    colours keep that order in greyscale (a qualitative palette made layers 1 and 3 alike in grey).
    """
    return matplotlib.colormaps[_LAYER_MAP](_LAYER_END * (layer - 1) / max(1, depth - 1))


def ordered_colour(index: int, count: int) -> Any:
    """The colour of the ``index``-th of ``count`` ordered series (e.g. confidence thresholds): light to dark.

    Neighbours are equally far apart in CIELAB; :func:`ordered_style` adds a marker per series.
    """
    cmap = matplotlib.colormaps[_ORDERED_MAP]
    grid = np.linspace(0.0, _ORDERED_END, 256)
    lab = _cielab(cmap(grid)[:, :3])
    travelled = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(lab, axis=0), axis=1))])
    target = travelled[-1] * (1.0 - index / max(1, count - 1))
    return cmap(float(np.interp(target, travelled, grid)))


def _cielab(rgb: np.ndarray) -> np.ndarray:
    """CIELAB (D65) of sRGB rows in [0, 1]."""
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = linear @ np.array([[0.4124, 0.2126, 0.0193], [0.3576, 0.7152, 0.1192], [0.1805, 0.0722, 0.9505]])
    xyz = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return np.stack([116 * f[:, 1] - 16, 500 * (f[:, 0] - f[:, 1]), 200 * (f[:, 1] - f[:, 2])], axis=1)


def ordered_style(index: int, count: int) -> dict[str, Any]:
    """Line style of the ``index``-th of ``count`` ordered series: its colour (:func:`ordered_colour`), its marker."""
    return {"color": ordered_colour(index, count), "marker": _ORDERED_MARKERS[index % len(_ORDERED_MARKERS)]}


# groups of runs (``plot RUN...``): told apart by marker and dash as well as by colour, so that two groups differ in
# greyscale and for any colour vision (the standard and aligned lines had L* 46 and 54, one marker, one dash)
_GROUP_MARKERS = ("o", "s", "^", "D", "v", "P")
_GROUP_DASHES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 1)))


def group_style(index: int) -> dict[str, Any]:
    """Line style of the ``index``-th group of runs: a colour (:data:`SERIES_PALETTE`), a marker and a dash."""
    return {
        "color": SERIES_PALETTE[index % len(SERIES_PALETTE)],
        "marker": _GROUP_MARKERS[index % len(_GROUP_MARKERS)],
        "linestyle": _GROUP_DASHES[index % len(_GROUP_DASHES)],
    }


def dodge(index: int, count: int, width: float = 0.36) -> float:
    """How far to shift the ``index``-th of ``count`` series along a categorical x axis (layers), within ``width``.

    Series that coincide (two thresholds with the same exits at every layer) are drawn side by side, not one
    hidden under the other.
    """
    return 0.0 if count <= 1 else width * (index / (count - 1) - 0.5)


def series_colour(name: str, index: int = 0) -> str:
    """The colour of a named series (a quantity, a residual branch...), else the ``index``-th of the series palette."""
    return _SERIES.get(name.lower(), SERIES_PALETTE[index % len(SERIES_PALETTE)])


def quantity_colour(quantity: str) -> str:
    """The one colour of ``quantity`` (a key of :data:`QUANTITY_COLOURS`): figures, report, TensorBoard images."""
    return QUANTITY_COLOURS[quantity]


def stage_name(stage: str) -> str:
    """A stage in words: ``val`` -> validation, ``val_corrupted`` -> validation (corrupted), ``test`` -> test."""
    if stage in STAGE_NAMES:
        return STAGE_NAMES[stage]
    head, _, rest = stage.partition("_")
    if head in STAGE_NAMES and rest:
        return f"{STAGE_NAMES[head]} ({rest.replace('_', ' ')})"
    return stage.replace("_", " ")


def plain(text: Any) -> str:
    """A value of a results file as text on a figure: its ``$`` kept as a dollar sign, never read as mathtext."""
    return str(text).replace("$", r"\$")


def run_line(summary: dict[str, Any], run: Optional[str] = None) -> str:
    """Which validation a figure shows, e.g. ``validation, epoch 31, step 736`` (``run · validation, ...``)."""
    stage, epoch, step = summary.get("stage", "val"), summary.get("epoch", "?"), summary.get("global_step", "?")
    where = plain(f"{stage_name(stage)}, epoch {epoch}, step {step}")
    return f"{run} · {where}" if run else where


def similarity_map(values: np.ndarray, quantity: str) -> dict[str, Any]:
    """``imshow`` arguments of a similarity matrix (``quantity`` a key of :data:`SIMILARITY_LABELS`).

    COS with a negative value: a diverging map centred at 0 over [-1, 1]; else, CKA and the CCA family, a sequential
    map over [0, 1]; the distances (Procrustes, shape) the reversed sequential map from 0, so that near is bright.
    """
    finite = values[np.isfinite(values)]
    if quantity == "cos" and finite.size and finite.min() < 0:
        return {"cmap": _DIVERGING_MAP, "vmin": -1.0, "vmax": 1.0}
    if quantity in SIMILARITY_RANGES:  # a distance: its usual range, widened to the values (reversed: near is bright)
        low, high = SIMILARITY_RANGES[quantity]
        high = max(high, float(finite.max())) if finite.size else high
        return {"cmap": _SEQUENTIAL_MAP + "_r", "vmin": low, "vmax": high}
    return {"cmap": _SEQUENTIAL_MAP, "vmin": 0.0, "vmax": 1.0}


def cell_values(fig: Figure, ax: Any, image: Any, values: np.ndarray, most: int = 12) -> bool:
    """Write each cell's value in the cells of ``image`` (up to ``most`` rows and columns); returns whether written.

    In black or white as the cell is light or dark, with the fewest decimals dropped that make every value fit its
    cell: ``0.95``, else ``.95``, else ``.9`` (a negative one with a true minus, else, narrower, a hyphen): nothing is
    written where even that would not fit.
    """
    rows, columns = values.shape
    if max(rows, columns) > most:
        return False
    renderer = fig.canvas.get_renderer()
    ax.apply_aspect()  # the cells' size as drawn: an equal-aspect image fills less than its axes' box
    box = ax.get_position()
    cell = min(box.width * fig.bbox.width / columns, box.height * fig.bbox.height / rows)  # pixels
    font = matplotlib.font_manager.FontProperties(size=sizes().note)

    def formats(value: float) -> list[str]:
        text = f"{value:.2f}"
        short = text.replace("0.", ".", 1) if abs(value) < 1 else f"{value:.1f}"
        return [text, short, short[:-1] if abs(value) < 1 else f"{value:.0f}"]

    finite = [(i, j, float(values[i, j])) for i in range(rows) for j in range(columns) if np.isfinite(values[i, j])]
    for choice, minus in ((0, "−"), (1, "−"), (2, "−"), (2, "-")):
        texts = [(i, j, v, formats(v)[choice].replace("-", minus)) for i, j, v in finite]
        widest = max((renderer.get_text_width_height_descent(t, font, ismath=False)[0] for *_, t in texts), default=0)
        if widest <= 0.88 * cell:
            break
    else:
        return False
    for i, j, value, text in texts:
        r, g, b, _ = image.cmap(image.norm(value))
        light = 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.45
        ax.text(j, i, text, ha="center", va="center", fontsize=sizes().note, color="black" if light else "white")
    return True


def stamp(fig: Figure, line: str) -> Figure:
    """Add ``line`` (e.g. :func:`run_line`) under the title of ``fig``: its suptitle, else its first titled axes.

    Stamping again replaces the line. The canvas grows by the line's height, so that the axes keep their size; a line
    wider than the canvas is broken after its run (``run ·``).
    """
    titles = ([fig._suptitle] if fig._suptitle is not None else []) + [ax.title for ax in fig.axes]
    title = next((text for text in titles if text.get_text()), None)
    if title is None:
        title = fig.axes[0].title
        title.set_fontsize(sizes().title)
    text, previous = title.get_text(), getattr(fig, "_layerwise_stamp", None)
    font = matplotlib.font_manager.FontProperties(size=sizes().title)
    width = fig.canvas.get_renderer().get_text_width_height_descent(line, font, ismath=False)[0] / fig.dpi
    if width > 0.9 * fig.get_size_inches()[0] and " · " in line:
        line = line.replace(" · ", "\n", 1)
    replaced = previous is not None and text.endswith(previous)
    previous_lines = previous.count("\n") + 1 if previous is not None and replaced else 0
    if replaced:
        text = text[: -len(previous or "")].rstrip("\n")
    if text:  # room for the line's lines (beyond the replaced line's)
        added = sizes().title_line * (line.count("\n") + 1 - previous_lines)
        width, height = fig.get_size_inches()
        fig.set_size_inches(width, height + added)
        set_margins(fig, top=getattr(fig, "_layerwise_margins", {}).get("top", 0.1 + sizes().title_line) + added)
    title.set_text(f"{text}\n{line}" if text else line)
    fig._layerwise_stamp = line
    return fig


def fit_to_cells(fig: Figure, ax: Any, rows: int, columns: int) -> None:
    """Make the cells of a ``rows`` x ``columns`` image in ``ax`` square: the canvas as high as they need (<= 4 in).

    Where 4 in of height cannot give the axes' width square cells (a page-wide heatmap), the axes (and the colorbar
    of :func:`new_figure`'s ``colorbar=True``) are narrowed and centred instead of stretching the cells. The margins
    are kept in inches; draw the image with ``aspect="auto"``, so that its colorbar is as high as it is.
    """
    width, height = fig.get_size_inches()
    box = ax.get_position()
    axes_width, axes_height = box.width * width, box.height * height
    wanted = min(axes_width * rows / max(1, columns), 4.0)  # inches of height
    narrower = axes_width - wanted * columns / max(1, rows)
    fig.set_size_inches(width, height + wanted - axes_height)
    if narrower > 0.01:
        margins = getattr(fig, "_layerwise_margins", {})
        left, right = margins.get("left", sizes().left), margins.get("right", sizes().right)
        bar = getattr(fig, "_layerwise_colorbar", None)
        if bar is not None:  # new_figure's columns: the image, then a 0.1-in bar 0.08 in from it
            region, bar_width, gap = width - left - right - narrower, 0.1, 0.08
            grid = ax.get_subplotspec().get_gridspec()
            grid.set_width_ratios([region - bar_width - gap, bar_width])
            fig.subplots_adjust(wspace=2 * gap / (region - gap))
        set_margins(fig, left=left + narrower / 2, right=right + narrower / 2)
        return
    set_margins(fig)


def colorbar(fig: Figure, image: Any, ax: Any, label: str, own_axes: bool = False) -> Any:
    """A colorbar beside ``ax`` (or a list of axes; or in ``ax`` itself if ``own_axes``) that says what it means."""
    if own_axes:
        bar = fig.colorbar(image, cax=ax)
    elif getattr(fig, "_layerwise_colorbar", None) is not None:  # new_figure(colorbar=True) made its axes
        bar = fig.colorbar(image, cax=fig._layerwise_colorbar)
    else:
        bar = fig.colorbar(image, ax=ax, shrink=0.9, fraction=0.06, pad=0.04)
    bar.set_label(label, fontsize=sizes().label)
    bar.ax.tick_params(labelsize=sizes().tick)
    return bar


def legend_inside(ax: Any, handles: Optional[list] = None, labels: Optional[list] = None, loc: str = "best") -> Any:
    """A short legend inside the axes, on a half-transparent box where it covers the fewest points."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    return ax.legend(handles, labels, loc=loc, fontsize=sizes().legend, framealpha=0.8)


def legend_below(fig: Figure, handles: list, labels: list, max_columns: int = 4) -> Any:
    """One legend for the whole figure, centred under the axes, in as many columns as fit the canvas' width.

    The legend is measured (no full draw); the canvas grows by its height and the bottom margin by as much, so the
    axes keep their size, and neither an empty band nor a legend over the axis label is left.
    """
    renderer = fig.canvas.get_renderer()
    columns = min(max_columns, len(handles))
    while True:
        order = _row_major(len(handles), columns)
        legend = fig.legend(
            [handles[k] for k in order],
            [labels[k] for k in order],
            loc="lower center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=columns,
            fontsize=sizes().legend,
            frameon=False,
            borderaxespad=0.3,
            columnspacing=1.2,
            handlelength=1.6,
        )
        box = legend.get_window_extent(renderer)
        if columns == 1 or box.width <= 0.98 * fig.bbox.width:
            break
        legend.remove()
        columns -= 1
    width, height = fig.get_size_inches()
    band = box.height / fig.dpi
    fig.set_size_inches(width, height + band)
    set_margins(fig, bottom=band + fig._layerwise_margins.get("bottom", sizes().bottom))
    return legend


def _row_major(count: int, columns: int) -> list[int]:
    """The order in which to hand ``count`` entries to a legend of ``columns`` columns so that they read by rows.

    Matplotlib fills a legend column by column, the first ``count % columns`` columns one entry longer.
    """
    sizes = [len(part) for part in np.array_split(np.arange(count), columns)]
    starts = np.cumsum([0, *sizes[:-1]])
    order = [0] * count
    for k in range(count):
        row, column = divmod(k, columns)
        order[starts[column] + row] = k
    return order


def finite_values(values: Any) -> np.ndarray:
    """The finite entries of nested lists (``None`` = NaN in the summaries) as a flat float array."""

    def flat(item: Any) -> Any:
        if isinstance(item, (list, tuple)):
            for inner in item:
                yield from flat(inner)
        else:
            yield np.nan if item is None else float(item)

    array = np.fromiter(flat(values), dtype=float)
    return array[np.isfinite(array)]


def hatch_missing(ax: Any, what: str = "no value") -> None:
    """Show the cells of an image without a value (NaN: drawn transparent) as hatched grey, said in the x label."""
    ax.set_facecolor("0.93")
    ax.patch.set_hatch("////")
    ax.patch.set_edgecolor("0.65")
    ax.set_xlabel(f"{ax.get_xlabel()}  (hatched: {what})".strip())


def no_data_note(ax: Any, what: str) -> None:
    """Say on the axes that ``what`` has no finite value to draw (NaN inputs, or nothing analysed)."""
    ax.text(
        0.5,
        0.5,
        f"no finite {what} to draw",
        ha="center",
        va="center",
        transform=ax.transAxes,
        color="0.4",
        fontsize=sizes().label,
    )


def layer_ticks(ax: Any, layers: Sequence[Any], axis: str = "both", at_values: bool = False, most: int = 12) -> None:
    """Layer numbers (or any labels) as ticks, at most ``most`` of them, the first and a regular step after it.

    ``at_values``: the ticks sit at the layer numbers themselves (line plots against the layer), else at positions
    0, 1, ... (images, box plots). Fewer where the axes are too narrow for ``most`` labels side by side.
    """
    if axis in ("x", "both") and len(layers):
        box, (width, _) = ax.get_position(), ax.figure.get_size_inches()
        label = max(len(str(layer)) for layer in layers) * 0.62 * sizes().tick / 72 + 0.1  # inches, with a gap
        most = max(2, min(most, int(box.width * width / label)))
    step = max(1, math.ceil(len(layers) / most))
    chosen = list(range(0, len(layers), step))
    positions = [layers[i] for i in chosen] if at_values else chosen
    labels = [str(layers[i]) for i in chosen]
    if axis in ("x", "both"):
        ax.set_xticks(positions, labels)
    if axis in ("y", "both"):
        ax.set_yticks(positions, labels)


DIRECT_LABEL = "layerwise-direct-label"  # the gid of a line's direct label (tests find them by it)


def direct_labels(
    fig: Figure,
    ax: Any,
    ends: Sequence[tuple[float, float]],
    texts: Sequence[str],
    colours: Sequence[Any],
    widest: float = 0.3,
) -> bool:
    """Label each line at its right end (``ends[i]``, data coordinates), in its colour, if the labels fit there.

    They fit when the ends, as drawn, are at least a label's height apart (no label touches another) and the widest
    label, 5 pt right of the ends and 3 pt clear of the frame, takes at most ``widest`` of the axes' width; the x axis
    is then widened to the right to make room for them. Returns whether they were written (else nothing is drawn: the
    caller keeps its legend).
    """
    if len(ends) < 2 or len(texts) != len(ends):
        return False
    renderer = fig.canvas.get_renderer()
    ax.get_xlim(), ax.get_ylim()  # settle the autoscaled limits before measuring in pixels
    area = ax.get_window_extent(renderer)
    size, gap = sizes().legend, 5.0  # points
    pixels = fig.dpi / 72.0
    probes = [ax.text(0, 0, text, fontsize=size) for text in texts]
    boxes = [probe.get_window_extent(renderer) for probe in probes]
    for probe in probes:
        probe.remove()
    width = max(box.width for box in boxes) + (gap + 3.0) * pixels  # 3 pt clear of the axes' frame
    height = max(box.height for box in boxes)
    if width > widest * area.width:
        return False
    ys = sorted(ax.transData.transform(end)[1] for end in ends)
    if any(b - a < height for a, b in zip(ys, ys[1:])):
        return False
    x0, x1 = ax.get_xlim()
    right = max(x for x, _ in ends)
    reach = (right - x0) * area.width / (x1 - x0)  # pixels from the left edge to the ends
    if reach + width > area.width:  # widen the axis so that the labels end inside the axes
        ax.set_xlim(x0, x0 + (right - x0) * area.width / (area.width - width))
    for (_, y), text, colour in zip(ends, texts, colours):
        ax.annotate(
            text,
            (right, y),
            xytext=(gap, 0),
            textcoords="offset points",
            ha="left",
            va="center",
            fontsize=size,
            color=colour,
            gid=DIRECT_LABEL,
            annotation_clip=False,
        )
    return True


def place_labels(
    fig: Figure, ax: Any, points: Sequence[tuple[float, float]], texts: Sequence[str], colours: Sequence[Any]
) -> int:
    """Write ``texts[i]`` beside ``points[i]``, at the first of a few offsets where it overlaps no other text.

    Close points get their labels on different sides; a label is dropped only when every offset overlaps a label
    already written, the axes' own texts or its legend, or leaves the axes. Returns how many labels were dropped
    (the caller's table has them all).
    """
    fig.canvas.draw()  # fixes the axis limits, so that label boxes are measured where they will be drawn
    renderer = fig.canvas.get_renderer()
    placed: list[Any] = [
        text.get_window_extent(renderer)
        for text in (*ax.get_xticklabels(), *ax.get_yticklabels(), ax.xaxis.label, ax.yaxis.label, ax.title)
        if text.get_visible() and text.get_text()
    ]
    legend = ax.get_legend()
    if legend is not None:  # where "best" put it now, kept there: the labels below must not move it onto a label
        box = legend.get_window_extent(renderer)
        legend.set_loc(tuple(ax.transAxes.inverted().transform((box.x0, box.y0))))
        placed.append(box)
    area = ax.get_window_extent(renderer)
    offsets = ((3, 3), (3, -11), (-3, 3), (-3, -11), (3, 12), (3, -20), (-3, 12), (-3, -20))
    dropped = 0
    for point, label, colour in zip(points, texts, colours):
        for dx, dy in offsets:
            text = ax.annotate(
                label,
                point,
                textcoords="offset points",
                xytext=(dx, dy),
                ha="left" if dx > 0 else "right",
                fontsize=sizes().note,
                color=colour,
            )
            box = text.get_window_extent(renderer)
            inside = area.x0 <= box.x0 and box.x1 <= area.x1 and area.y0 <= box.y0 and box.y1 <= area.y1
            if inside and not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            text.remove()
        else:
            dropped += 1
    return dropped


def panel_letter(ax: Any, index: int) -> Any:
    """Write ``(a)``, ``(b)``, ... above the top-left corner of ``ax`` (the ``index``-th panel), bold, title size."""
    letter = f"({chr(ord('a') + index)})"
    return ax.set_title(letter, loc="left", fontsize=sizes().title, fontweight="bold")


def untitled(fig: Figure) -> list[str]:
    """Take the titles off ``fig`` (its suptitle, its axes' centred titles and their stamped lines): a caption says it.

    Panel letters (left titles) stay. The canvas loses the title's room above the axes, which keep their size.
    Returns the lines taken off, for the file's metadata and sidecar (:func:`provenance_metadata`).
    """
    lines: list[str] = []
    texts = ([fig._suptitle] if fig._suptitle is not None else []) + [ax.title for ax in fig.axes]
    for text in texts:
        if text.get_text():
            lines.extend(line for line in text.get_text().split("\n") if line.strip())
            text.set_text("")
    lettered = any(ax._left_title.get_text() for ax in fig.axes)
    top = getattr(fig, "_layerwise_margins", {}).get("top")
    if top is not None:
        keep = 0.1 + (sizes().title_line if lettered else 0.0)
        if top > keep:
            width, height = fig.get_size_inches()
            fig.set_size_inches(width, height - (top - keep))
            set_margins(fig, top=keep)
    fig._layerwise_provenance = lines
    return lines


def provenance_metadata(fig: Figure, fmt: str) -> dict[str, str]:
    """What a saved file of ``fig`` records of itself, in ``fmt``'s metadata keys: title, provenance, style version.

    The title lines (:func:`untitled` keeps them when it takes them off the canvas), ``layerwise`` and
    :data:`STYLE_VERSION`: PNG text chunks (``Title``, ``Description``, ``layerwise style``), PDF's ``Title``,
    ``Subject`` and ``Keywords``, SVG's ``Title`` and ``Description``.
    """
    lines = getattr(fig, "_layerwise_provenance", None)
    if lines is None:
        texts = ([fig._suptitle] if fig._suptitle is not None else []) + [ax.title for ax in fig.axes]
        lines = [line for text in texts for line in text.get_text().split("\n") if line.strip()]
    title, rest = (lines[0], " · ".join(lines[1:])) if lines else ("", "")
    version = f"layerwise style {STYLE_VERSION}"
    if fmt == "png":
        return {"Title": title, "Description": rest, "Software": "layerwise", "layerwise style": str(STYLE_VERSION)}
    if fmt == "pdf":
        return {"Title": title, "Subject": rest, "Keywords": version, "Creator": "layerwise"}
    if fmt == "svg":
        return {"Title": title, "Description": f"{rest} · {version}" if rest else version}
    return {}
