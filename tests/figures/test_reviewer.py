"""Figures a reviewer accepts (issue 52): honest at the edges, the seeds shown, laid out for a paper, readable in grey.

Each test fails on the figures of bfdb46c: ε-effective depth drawn at the last layer as if reached, bands above 1,
a band announced for one run, only means drawn, one file per quantity with a title built in, groups told apart by
colour alone.
"""

import json
import math
import shutil
import subprocess
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.colors import to_rgb
from test_figures import drawn_texts, synthetic_runs, synthetic_summary

from layerwise.figures.style import MIN_TEXT_SIZE, PRINTS, drawn_at

NODE = shutil.which("node")
RANGE = {"accuracy": (0.0, 1.0), "cos": (-1.0, 1.0), "cka": (0.0, 1.0)}  # what each quantity can take


def unreachable_runs(folder: Path, seeds=(0, 1, 2)) -> list[Path]:
    """Runs whose last layer is at 0.85-0.87, so that no layer reaches 1 - ε for ε 0.01, 0.05, 0.1 (as bfdb46c's
    quickstart): their summaries hold the paper's convention (depth 6) and ``effective_depth_reached`` false."""
    from layerwise.metrics import effective_depth, effective_depth_reached

    runs = synthetic_runs(folder, 6, seeds=seeds)
    for run in runs:
        for path in (run / "layerwise").glob("val_epoch_*.json"):
            summary = json.loads(path.read_text())
            summary["accuracy"] = [0.3 + 0.11 * k + 0.005 * (hash(run.name) % 3) for k in range(6)]  # 0.30 ... 0.86
            epsilons = [0.01, 0.05, 0.1]
            summary["effective_depth"] = effective_depth(summary["accuracy"], epsilons)
            summary["effective_depth_reached"] = effective_depth_reached(summary["accuracy"], epsilons)
            path.write_text(json.dumps(summary))
    return runs


# ------------------------------------------------------------------ 1. not reached
def test_the_metric_says_when_no_layer_reaches_one_minus_epsilon():
    from layerwise.metrics import effective_depth, effective_depth_reached

    accuracy = [0.5, 0.8, 0.86]
    assert effective_depth(accuracy, [0.01, 0.2]) == {"0.01": 3, "0.2": 2}  # the paper's convention at 0.01
    assert effective_depth_reached(accuracy, [0.01, 0.2]) == {"0.01": False, "0.2": True}
    assert effective_depth_reached(accuracy, [0.01], relative=True) == {"0.01": True}


def test_the_callback_logs_no_depth_where_none_is_reached():
    """TensorBoard drew the convention (6) as if reached: the scalar is NaN there (no point), a 0/1 flag beside it."""
    from layerwise.analyses.effective_depth import EffectiveDepthMonitor

    results = {
        "effective_depth": {"0.01": 6, "0.1": 6},
        "effective_depth_reached": {"0.01": False, "0.1": True},
        "effective_depth_relative": {"0.01": 5, "0.1": 3},
    }
    scalars = EffectiveDepthMonitor().layer_scalars(results)
    assert math.isnan(scalars["effective_depth/eps_0.01"]) and scalars["effective_depth/eps_0.1"] == 6
    assert scalars["effective_depth_reached/eps_0.01"] == 0.0 and scalars["effective_depth_reached/eps_0.1"] == 1.0


def test_a_depth_not_reached_is_drawn_open_and_written_not_reached(tmp_path):
    """One run's figure and several runs' figure, CSV and Markdown: an open marker and "not reached", never a filled
    point or a number at the last layer as if it were reached."""
    from layerwise.figures.overlay import comparison_figures, load_comparison, table_texts
    from layerwise.figures.summary import summary_figures

    summary = synthetic_summary(6)
    summary["accuracy"] = [0.3, 0.45, 0.6, 0.7, 0.8, 0.86]
    summary["effective_depth"] = {"0.01": 6, "0.05": 6, "0.1": 6}
    summary["effective_depth_reached"] = {"0.01": False, "0.05": False, "0.1": False}
    figure = summary_figures(summary)["effective_depth"]
    ax = figure.axes[0]
    absolute = next(line for line in ax.lines if line.get_label().startswith("accuracy $\\geq 1"))
    assert np.isnan(np.asarray(absolute.get_ydata(), dtype=float)).all(), "no filled point at the convention"
    (open_marks,) = [line for line in ax.lines if line.get_markerfacecolor() in ("white", "w", (1, 1, 1, 1))]
    assert list(open_marks.get_ydata()) == [6, 6, 6]
    legend = [text.get_text() for legend in (*figure.legends, ax.get_legend()) if legend for text in legend.texts]
    assert any(text.startswith("not reached") for text in legend), legend
    assert all(float(tick).is_integer() for tick in ax.get_yticks()), "whole layers"
    assert ax.get_ylim()[1] - ax.get_ylim()[0] >= 5, "every layer on the axis, not 5.68 ... 6.32"

    comparison = load_comparison(unreachable_runs(tmp_path))
    depth = [row for row in comparison.rows if row.quantity == "effective_depth"]
    assert depth and all(row.unreached == 3 and math.isnan(row.mean) for row in depth)
    tables = table_texts(comparison)
    assert tables["comparison.md"].count("| not reached | not reached |") == 3
    assert "6 ±" not in tables["comparison.md"].split("ε-effective depth")[1]
    csv_depth = [line for line in tables["comparison.csv"].splitlines() if line.startswith("effective_depth")]
    assert all(line.split(",")[4] == "" and line.endswith(",3") for line in csv_depth), csv_depth
    ax = comparison_figures(comparison)["effective_depth"].axes[0]
    means = [line for line in ax.lines if line.get_label().endswith("(n = 3)")]
    assert len(means) == 2 and all(np.isnan(np.asarray(line.get_ydata(), dtype=float)).all() for line in means)
    opened = [line for line in ax.lines if line.get_markerfacecolor() in ("white", "w", (1, 1, 1, 1))]
    assert len(opened) == 2 and all(list(line.get_ydata()) == [6.0] * 3 for line in opened)
    plt.close("all")


@pytest.mark.skipif(NODE is None, reason="node runs report.js")
def test_the_report_writes_not_reached(tmp_path):
    from test_print import rendered_report

    from layerwise.figures.report import write_report
    from layerwise.results import summary_path

    summary = dict(synthetic_summary(6), effective_depth={"0.01": 6, "0.1": 2})
    summary["effective_depth_reached"] = {"0.01": False, "0.1": True}
    path = summary_path(str(tmp_path / "run"), "val", 0, 23)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(summary))
    out, _ = write_report(tmp_path / "run")
    drawn = " ".join(rendered_report(out.read_text(encoding="utf-8")).values())
    assert "ε 0.01 → not reached" in drawn and "ε 0.1 → layer 2" in drawn
    assert "ε 0.01 → layer 6" not in drawn


# ------------------------------------------------------------------ 2. the seeds
@pytest.mark.parametrize("width", ["column", "page"])
def test_every_band_lies_within_the_quantitys_range(tmp_path, width):
    """With n = 3 the band reached 1.014 for COS and CKA: the interval's ends are clipped to [0, 1] / [-1, 1]."""
    from layerwise.figures.overlay import comparison_figures, load_comparison

    runs = synthetic_runs(tmp_path, 6)
    for run in runs:  # seeds spread near the top of the range: an unclipped interval leaves it
        for path in (run / "layerwise").glob("val_epoch_*.json"):
            summary = json.loads(path.read_text())
            seed = int(run.parent.name[-1])
            summary["accuracy"] = [min(1.0, 0.9 + 0.04 * seed + 0.01 * k) for k in range(6)]
            summary["cka"] = [[min(1.0, 0.95 + 0.025 * seed) for _ in row] for row in summary["cka"]]
            summary["cos"] = [[-1.0 + 0.03 * seed for _ in row] for row in summary["cos"]]
            path.write_text(json.dumps(summary))
    comparison = load_comparison(runs)
    unclipped = [row for row in comparison.rows if row.quantity in RANGE and row.mean + row.half_width > 1.0]
    unclipped += [row for row in comparison.rows if row.quantity == "cos" and row.mean - row.half_width < -1.0]
    assert unclipped, "the data must put an unclipped interval out of range, or the test tests nothing"
    with drawn_at(width):
        figures = comparison_figures(comparison)
    for name, (lower, upper) in RANGE.items():
        (ax,) = figures[name].axes
        bands = [band for band in ax.collections if isinstance(band, PolyCollection)]
        assert len(bands) == 2, name
        for band in bands:
            ys = np.concatenate([path.vertices[:, 1] for path in band.get_paths()])
            assert lower - 1e-12 <= ys.min() and ys.max() <= upper + 1e-12, (name, ys.min(), ys.max())
    for row in comparison.rows:  # a point no run has a value at (e.g. NC3 where the head has no rows) has no interval
        assert math.isnan(row.mean) or row.lower <= row.low <= row.high <= row.upper, row
    plt.close("all")


def test_a_group_of_one_run_announces_no_band(tmp_path):
    """One run per group: no band drawn, and neither the legend, the title nor the table speaks of one."""
    from layerwise.figures.overlay import comparison_figures, load_comparison, table_texts

    comparison = load_comparison(synthetic_runs(tmp_path, 6, seeds=(0,)))
    assert not comparison.banded
    for name, figure in comparison_figures(comparison).items():
        (ax,) = figure.axes
        assert not [band for band in ax.collections if isinstance(band, PolyCollection)], name
        words = " ".join(
            [ax.get_title(), *(text.get_text() for legend in figure.legends for text in legend.get_texts())]
        )
        assert "interval" not in words and "95 %" not in words and "band" not in words, (name, words)
        assert "standard (1 run)" in words and "one run per group" in words, words
    heading = table_texts(comparison)["comparison.md"].splitlines()[0]
    assert "interval" not in heading.replace("no interval", "") and "one run per group" in heading
    assert "±" not in table_texts(comparison)["comparison.md"]
    plt.close("all")


def test_each_seed_is_drawn_under_the_mean(tmp_path):
    """Each run's value is a faint point at its layer, beneath the group's mean line (numbers read with json)."""
    from layerwise.figures.overlay import comparison_figures, load_comparison

    runs = synthetic_runs(tmp_path, 6)
    figures = comparison_figures(load_comparison(runs))
    for name in ("accuracy", "cos", "nc1"):
        (ax,) = figures[name].axes
        dots = [c for c in ax.collections if isinstance(c, PathCollection)]
        lines = [line for line in ax.get_lines() if line.get_label().endswith("(n = 3)")]
        assert len(dots) == 2 == len(lines), name
        for dots_of, line, group in zip(dots, lines, (runs[:3], runs[3:])):
            expected = []
            for run in group:
                summary = json.loads(sorted((run / "layerwise").glob("val_epoch_001_*.json"))[0].read_text())
                value = summary[name]
                expected.append([row[-1] for row in value] if name == "cos" else value)
            drawn = np.asarray(dots_of.get_offsets())
            np.testing.assert_allclose(np.sort(drawn[:, 1]), np.sort(np.ravel(expected)), rtol=1e-12)
            assert set(np.round(drawn[:, 0], 9)) == set(np.round(line.get_xdata(), 9)), "at the mean's x"
            assert dots_of.get_alpha() < 0.5 and dots_of.get_zorder() < line.get_zorder(), "faint, beneath"
    plt.close("all")


def test_tables_keep_the_digits_the_interval_supports():
    """``6.0000 ± 0.0000`` and four decimals: now two significant digits of the half-width, accuracies in %."""
    from layerwise.figures.seeds import Row, cell

    assert cell(Row("accuracy", "a", 3, 1, 0.8612345, 0.0123456, ())) == "86.1 ± 1.2"
    assert cell(Row("cos", "a", 3, 1, 0.412345, 0.0312, ())) == "0.412 ± 0.031"
    assert cell(Row("effective_depth", "a", 3, 0.1, 6.0, 0.0, ())) == "6 ± 0"
    assert cell(Row("nc1", "a", 1, 1, 12.3456, math.nan, ())) == "12.3"
    assert cell(Row("effective_depth", "a", 3, 0.1, math.nan, math.nan, (), unreached=1)) == (
        "not reached in 1 of 3 runs"
    )


# ------------------------------------------------------------------ 3. a paper's layout
def test_the_multi_panel_figure_at_column_width_keeps_7_pt_and_its_letters(tmp_path):
    from layerwise.figures.overlay import load_comparison, panels_figure

    comparison = load_comparison(synthetic_runs(tmp_path, 6))
    with drawn_at("column"):
        figure = panels_figure(comparison, ["accuracy", "cos", "cka", "nc1"])
    assert figure.get_size_inches()[0] == pytest.approx(PRINTS["column"].width)
    texts = drawn_texts(figure)
    small = {text.get_text(): text.get_fontsize() for text in texts if text.get_fontsize() < MIN_TEXT_SIZE}
    assert not small, small
    letters = [text.get_text() for text in texts if text.get_text() in ("(a)", "(b)", "(c)", "(d)")]
    assert letters == ["(a)", "(b)", "(c)", "(d)"]
    assert len(figure.axes) == 4 and not any(ax.get_title() for ax in figure.axes), "no title: the caption says it"
    renderer = figure.canvas.get_renderer()
    canvas = figure.bbox
    for text in texts:  # nothing off the canvas
        box = text.get_window_extent(renderer)
        assert canvas.x0 - 1 <= box.x0 and box.x1 <= canvas.x1 + 1 and box.y1 <= canvas.y1 + 1, text.get_text()
    with pytest.raises(ValueError, match="--panels"):
        panels_figure(comparison, ["accuracy", "loss"])
    plt.close("all")


def test_plot_no_title_dpi_and_panels(tmp_path, capsys):
    """``plot --no_title`` moves the titles into the files' metadata and a sidecar; ``--dpi`` sets the PNG's
    resolution; ``--panels`` writes the (a)-(d) figure beside the others."""
    from PIL import Image

    from layerwise.cli import main
    from layerwise.figures.style import STYLE_VERSION

    runs = [str(run) for run in synthetic_runs(tmp_path / "runs", 6)]
    out = tmp_path / "out"
    argv = ["plot", *runs, "--out", str(out), "--format", "png", "pdf", "--no_title", "true", "--dpi", "600"]
    main([*argv, "--width", "column", "--panels", "accuracy,cos,cka,nc1"])
    image = Image.open(out / "comparison_panels.png")
    assert image.info["dpi"][0] == pytest.approx(600, abs=1)
    assert image.size[0] / 600 == pytest.approx(3.3, abs=0.01)
    assert image.info["layerwise style"] == str(STYLE_VERSION)
    sidecar = json.loads((out / "comparison_accuracy.json").read_text())
    assert sidecar["title"] == "accuracy of the shared head at each layer"
    assert "validation, epoch 1 (the last)" in sidecar["provenance"] and sidecar["style_version"] == STYLE_VERSION
    assert Image.open(out / "comparison_accuracy.png").info["Title"] == sidecar["title"]
    pdf = (out / "comparison_accuracy.pdf").read_bytes()
    assert b"accuracy of the shared head at each layer" in pdf and f"layerwise style {STYLE_VERSION}".encode() in pdf
    with pytest.raises(SystemExit):
        main([*argv[:-2], "--dpi", "20"])
    assert "--dpi=20" in capsys.readouterr().err
    plt.close("all")


def test_legends_name_training_modes_in_words():
    from layerwise.figures.seeds import class_words

    assert class_words("layerwise.lightning_modules.AlternatingAligned") == "alternating aligned"
    assert class_words("layerwise.lightning_modules.MultiExit") == "multi exit"
    assert class_words("Standard") == "standard"
    assert class_words("my.CKAModel") == "cka model"


# ------------------------------------------------------------------ 4. readable without colour
def greyscale(colour) -> float:
    r, g, b = to_rgb(colour)
    return 0.299 * r + 0.587 * g + 0.114 * b


@pytest.mark.parametrize("groups", [2, 4])
def test_groups_differ_in_greyscale_by_marker_or_dash(tmp_path, groups):
    """Standard and aligned had L* 46 and 54, one marker, one dash: identical in grey. Every pair of groups' lines
    in every comparison figure now differs in marker and in dash."""
    from layerwise.figures.overlay import comparison_figures, load_comparison

    runs = synthetic_runs(tmp_path, 6, seeds=(0, 1))
    labels = [f"group {index // (len(runs) // groups)}" for index in range(len(runs))]
    comparison = load_comparison(runs, labels=labels if groups != 2 else None)
    for name, figure in comparison_figures(comparison).items():
        lines = [line for line in figure.axes[0].get_lines() if not line.get_label().startswith("_")]
        assert len(lines) == groups, name
        styles = [(line.get_marker(), str(line.get_linestyle())) for line in lines]
        for i in range(groups):
            for j in range(i + 1, groups):
                assert styles[i][0] != styles[j][0] and styles[i][1] != styles[j][1], (name, styles)
    plt.close("all")


def test_layers_are_ordered_in_greyscale():
    """The layer palette was qualitative (layers 1 and 3 alike in grey): now an ordered map whose lightness grows
    with the layer, the same in the figures, the report and TensorBoard's images."""
    from matplotlib.colors import to_hex

    from layerwise.figures.report import layer_colors
    from layerwise.figures.style import layer_colour

    for depth in (3, 6, 12, 24):
        grey = [greyscale(layer_colour(layer, depth)) for layer in range(1, depth + 1)]
        assert all(b - a > 0.01 for a, b in zip(grey, grey[1:])), (depth, grey)
        assert layer_colors(depth) == [to_hex(layer_colour(layer, depth)) for layer in range(1, depth + 1)]


def direct_labels_of(ax) -> list:
    from layerwise.figures.style import DIRECT_LABEL

    return [text for text in ax.texts if text.get_gid() == DIRECT_LABEL]


def set_last_layer(runs, quantity: str, values) -> None:
    """Put each run's ``quantity`` at the last layer at ``values[i]`` (all its epochs)."""
    for run, value in zip(runs, values):
        for path in (run / "layerwise").glob("val_epoch_*.json"):
            summary = json.loads(path.read_text())
            if quantity == "cos":
                summary["cos"][-1][-1] = value
            else:
                summary[quantity][-1] = value
            path.write_text(json.dumps(summary))


def test_groups_are_named_at_their_lines_ends_where_they_fit(tmp_path):
    """Each group's name at the right end of its mean line, in its colour, inside the axes, beside its last point;
    the legend then keeps what the band and dots are (with n) and no longer lists the groups."""
    from layerwise.figures.overlay import load_comparison, per_point_figure

    runs = synthetic_runs(tmp_path, 6)
    comparison = load_comparison(runs, labels=["standard"] * 3 + ["aligned"] * 3)
    for width in ("column", "page"):
        with drawn_at(width):
            figure = per_point_figure(comparison, "accuracy")
        (ax,) = figure.axes
        labels = direct_labels_of(ax)
        assert [text.get_text() for text in labels] == ["standard", "aligned"], width
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        area = ax.get_window_extent(renderer)
        lines = [line for line in ax.get_lines() if line.get_label().endswith("(n = 3)")]
        boxes = []
        for text, line in zip(labels, lines):
            assert text.get_color() == line.get_color(), "in the group's colour"
            right = max(other.get_xdata()[-1] for other in lines)  # the ends nudged apart: one column of labels
            assert text.xy == (right, line.get_ydata()[-1]), "level with the line's end, right of every end"
            box = text.get_window_extent(renderer)
            end = ax.transData.transform(text.xy)
            assert box.x0 > end[0] and box.y0 < end[1] < box.y1, "right of the end, level with it"
            assert area.x0 <= box.x0 and box.x1 <= area.x1, (width, "inside the axes")
            assert text.get_fontsize() >= MIN_TEXT_SIZE
            boxes.append(box)
        assert not boxes[0].overlaps(boxes[1])
        legend = [text.get_text() for legend in figure.legends for text in legend.get_texts()]
        assert legend == ["mean ± 95 % t-interval, n = 3; dots: each seed"], legend
    plt.close("all")


def test_groups_whose_lines_end_together_keep_the_legend(tmp_path):
    """Ends closer than a label's height, labels too wide for the axes, groups of one run or of different sizes:
    no direct label, the legend names each group as before."""
    from layerwise.figures.overlay import load_comparison, panels_figure, per_point_figure

    runs = synthetic_runs(tmp_path / "level", 6)
    set_last_layer(runs, "accuracy", [0.9] * 6)  # both groups end at the same accuracy
    figure = per_point_figure(load_comparison(runs), "accuracy")
    assert not direct_labels_of(figure.axes[0])
    legend = {text.get_text() for legend in figure.legends for text in legend.get_texts()}
    assert {"standard (n = 3)", "alternating aligned (n = 3)"} <= legend
    with drawn_at("column"):  # "alternating aligned" is over 30 % of a column-wide axes
        figure = per_point_figure(load_comparison(synthetic_runs(tmp_path / "wide", 6)), "cos")
    assert not direct_labels_of(figure.axes[0])
    assert "alternating aligned (n = 3)" in {text.get_text() for text in figure.legends[0].get_texts()}
    uneven = synthetic_runs(tmp_path / "uneven", 6, seeds=(0, 1))[:3]  # two standard runs, one aligned
    figure = per_point_figure(load_comparison(uneven), "accuracy")
    assert not direct_labels_of(figure.axes[0])
    # the panels: the groups named at the ends in every panel, or in the legend (never both, never in some panels)
    comparison = load_comparison(synthetic_runs(tmp_path / "panels", 6), labels=["standard"] * 3 + ["aligned"] * 3)
    figure = panels_figure(comparison, ["accuracy", "cos"])
    named = [bool(direct_labels_of(ax)) for ax in figure.axes]
    legend = {text.get_text() for legend in figure.legends for text in legend.get_texts()}
    assert all(named) != ("standard (n = 3)" in legend) and len(set(named)) == 1, (named, legend)
    plt.close("all")


def test_every_drawn_quantity_has_its_range():
    """A band is clipped to what its quantity can take (seeds.RANGES): every per-layer key of the summary schema that
    a comparison draws has a range there (the lens's KL had none, so its band could go below 0)."""
    from layerwise.figures.seeds import PER_LAYER, QUANTITIES, RANGES
    from layerwise.results import SUMMARY_SCHEMA

    per_layer = {*PER_LAYER, "cos", "cka"}
    assert per_layer <= set(SUMMARY_SCHEMA), per_layer - set(SUMMARY_SCHEMA)
    drawn = {quantity for quantity in QUANTITIES if quantity in SUMMARY_SCHEMA and quantity != "effective_depth"}
    assert per_layer <= drawn
    assert drawn <= set(RANGES), drawn - set(RANGES)  # effective depth: the layers, set per comparison
    assert set(QUANTITIES) - {"effective_depth"} <= set(RANGES)
    assert RANGES["kl_to_final"] == (0.0, math.inf)


def test_the_kl_band_stays_at_or_above_zero(tmp_path):
    from layerwise.figures.overlay import load_comparison, per_point_figure

    runs = synthetic_runs(tmp_path, 6)
    for run in runs:  # near 0 and spread: an unclipped 95 % interval goes below 0
        seed = int(run.parent.name[-1])
        for path in (run / "layerwise").glob("val_epoch_*.json"):
            summary = json.loads(path.read_text())
            summary["kl_to_final"] = [0.002 + 0.05 * seed * (6 - k) / 6 for k in range(6)]
            path.write_text(json.dumps(summary))
    comparison = load_comparison(runs)
    rows = [row for row in comparison.rows if row.quantity == "kl_to_final"]
    assert any(row.mean - row.half_width < 0 for row in rows), "the data must put an unclipped interval below 0"
    (ax,) = per_point_figure(comparison, "kl_to_final").axes
    bands = [band for band in ax.collections if isinstance(band, PolyCollection)]
    assert len(bands) == 2
    for band in bands:
        assert min(path.vertices[:, 1].min() for path in band.get_paths()) >= 0.0
    plt.close("all")


def test_the_cos_distribution_has_no_twin_axis_and_names_its_whiskers():
    from layerwise.figures.summary import summary_figures

    figure = summary_figures(synthetic_summary(6))["cos_distribution"]
    boxes, below = figure.axes
    assert boxes.get_shared_x_axes().joined(boxes, below), "the % negative on axes of its own, sharing the layers"
    assert boxes.get_position().y0 > below.get_position().y1, "under the boxes, not over them"
    assert "%" in below.get_ylabel()
    legend = [text.get_text() for legend in figure.legends for text in legend.get_texts()]
    assert "whiskers: 1st–99th percentiles" in legend
    plt.close("all")


def test_heatmap_cells_are_square_at_both_widths():
    from layerwise.figures.summary import summary_figures

    for width in ("column", "page"):
        with drawn_at(width):
            figure = summary_figures(synthetic_summary(6))["cos"]
        ax = figure.axes[0]
        box, (w, h) = ax.get_position(), figure.get_size_inches()
        assert box.width * w == pytest.approx(box.height * h, rel=0.02), width
    plt.close("all")


def test_early_exit_comparison_marks_tau_on_its_points(tmp_path):
    from layerwise.figures.overlay import comparison_figures, load_comparison

    runs = synthetic_runs(tmp_path, 6)
    figure = comparison_figures(load_comparison(runs))["early_exit"]
    thresholds = {f"{row['threshold']:g}" for row in synthetic_summary(6)["early_exit"]}
    written = {text.get_text() for text in figure.axes[0].texts}
    assert len(written & thresholds) >= len(thresholds) - 2, written
    legend = [text.get_text() for legend in figure.legends for text in legend.get_texts()]
    assert "numbers: the threshold τ" in legend
    plt.close("all")


@pytest.mark.skipif(shutil.which("pdffonts") is None, reason="pdffonts reads the PDF's fonts")
def test_the_panels_pdf_embeds_truetype(tmp_path):
    from layerwise.figures.overlay import load_comparison, write_comparison

    comparison = load_comparison(synthetic_runs(tmp_path / "runs", 6))
    write_comparison(comparison, tmp_path / "out", ["pdf"], "column", panels=["accuracy", "cos"])
    fonts = subprocess.run(
        ["pdffonts", str(tmp_path / "out" / "comparison_panels.pdf")], capture_output=True, text=True
    )
    assert "Type 3" not in fonts.stdout and "TrueType" in fonts.stdout
