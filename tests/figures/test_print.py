"""Figures for print (issue 41, parts 3-4): every figure at a journal's column (3.3 in) and page (6.9 in) width with
text >= 7 pt, COS on a diverging map when it is negative, words instead of keys in every text a reader sees (figures,
report, console table), and one colour per quantity and per layer in the figures, the report and TensorBoard's
images. Each test fails on the figures of 380d8c9."""

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_hex
from matplotlib.text import Text
from test_figures import drawn_texts, every_figure, named_groups, synthetic_summary

from layerwise.figures.style import PRINTS, QUANTITY_COLOURS, drawn_at, layer_colour
from layerwise.figures.summary import summary_figures
from layerwise.results import summary_path

NODE = shutil.which("node")


# ------------------------------------------------------------------ print size
@pytest.mark.parametrize("width", ["column", "page"])
def test_every_figure_is_drawn_at_the_print_width_with_text_of_at_least_7_pt(width):
    """Every figure the package draws is ``width`` wide (3.3 or 6.9 in) natively, and every text it draws (titles,
    labels, ticks, legends, cell values, notes) is at least 7 pt at that size."""
    with drawn_at(width):
        figures = every_figure(6)
    assert len(figures) >= 25
    for name, figure in figures.items():
        assert figure.get_size_inches()[0] == pytest.approx(PRINTS[width].width), name
        small = {text.get_text(): text.get_fontsize() for text in drawn_texts(figure) if text.get_fontsize() < 7}
        assert not small, f"{name}: text under 7 pt at {width} width: {small}"
        plt.close(figure)


def test_plot_draws_at_the_width_asked_for(tmp_path, capsys):
    """``layerwise plot --width column`` writes 3.3-inch figures (the PNG's pixels over its dpi), page 6.9 inch."""
    from PIL import Image

    from layerwise.cli import main

    path = summary_path(str(tmp_path / "run"), "val", 31, 736)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(synthetic_summary(6)))
    for width, inches in (("column", 3.3), ("page", 6.9)):
        main(["plot", str(path), "--out", str(tmp_path / width), "--format", "png", "--width", width])
        pngs = sorted((tmp_path / width).glob("*.png"))
        assert len(pngs) >= 10
        for png in pngs:
            image = Image.open(png)
            assert image.size[0] / image.info["dpi"][0] == pytest.approx(inches, abs=0.02), png.name
    with pytest.raises(SystemExit):
        main(["plot", str(path), "--width", "poster"])
    assert "--width" in capsys.readouterr().err


# ------------------------------------------------------------------ honest colour
def cos_image(figure):
    (image,) = figure.axes[0].images
    return image


@pytest.mark.parametrize("num_layers", [6, 24])
def test_a_negative_cos_is_drawn_on_a_diverging_map_centred_at_zero(num_layers):
    """A negative COS (the paper's B.1) was drawn near the bottom of a sequential map whose minimum followed the data:
    told apart from zero by nothing. With a negative value: a diverging map over [-1, 1] whose middle (white) is 0;
    without: a sequential map over [0, 1]. The colour bar says what it shows in words; up to 12 layers every cell
    holds its value (numpy's rounding of the matrix), none beyond."""
    summary = synthetic_summary(num_layers)
    cos = np.asarray(summary["cos"])
    summary["cos"] = (cos - 0.5).tolist()  # values in [-0.1, 0.5]
    negative = summary_figures(summary)["cos"]
    image = cos_image(negative)
    assert image.get_clim() == (-1.0, 1.0)
    centre = np.asarray(image.cmap(image.norm(0.0))[:3])
    assert np.all(centre > 0.9), f"0 is not the map's pale middle: {centre}"
    low, high = np.asarray(image.cmap(image.norm(-1.0))[:3]), np.asarray(image.cmap(image.norm(1.0))[:3])
    assert abs(low[2] - low[0]) > 0.2 and abs(high[2] - high[0]) > 0.2 and (low[2] - low[0]) * (high[2] - high[0]) < 0
    bar = negative.axes[-1]
    assert bar.get_ylabel() == "mean cosine similarity"
    cells = [text.get_text() for text in negative.axes[0].texts]
    if num_layers <= 12:
        expected = [f"{value:.2f}".replace("-", "−") for value in np.asarray(summary["cos"]).ravel()]
        short = [t.replace("0.", ".", 1) for t in expected]
        assert cells in (expected, short), cells[:8]
    else:
        assert cells == []
    positive = summary_figures(synthetic_summary(num_layers))["cos"]
    image = cos_image(positive)
    assert image.get_clim() == (0.0, 1.0)
    lightness = [np.mean(image.cmap(image.norm(v))[:3]) for v in (0.0, 0.5, 1.0)]
    assert lightness[0] < lightness[1] < lightness[2], "a sequential map, dark to light"
    plt.close("all")


def test_clip_cos_heatmaps_share_the_rule():
    from layerwise.figures.clip import clip_figures

    cos = [[1.0, -0.2], [-0.2, 1.0]]
    figures = clip_figures(
        {
            "num_pairs": 8,
            "vision_layers": [1, 2],
            "text_layers": [1, 2],
            "vision_cos": cos,
            "text_cos": [[1.0, 0.3], [0.3, 1.0]],
            "cross_cos": cos,
        }
    )
    assert cos_image(figures["vision"]).get_clim() == (-1.0, 1.0)
    assert cos_image(figures["cross"]).get_clim() == (-1.0, 1.0)
    assert cos_image(figures["text"]).get_clim() == (0.0, 1.0)
    plt.close("all")


def test_effective_depth_is_a_step_plot_of_whole_layers():
    """ε-effective depth joined three ε with sloped lines, as if a depth of 2.5 layers existed between them."""
    ax = summary_figures(synthetic_summary(6))["effective_depth"].axes[0]
    assert ax.lines and all(line.get_drawstyle() == "steps-post" for line in ax.lines)
    assert all(float(tick).is_integer() for tick in ax.get_yticks())
    assert [label.get_text() for label in ax.get_xticklabels()] == ["0.01", "0.05", "0.1"]
    plt.close("all")


def test_early_exit_is_a_threshold_by_layer_heatmap_of_shares():
    """Seven τ lines tangled near zero (τ 0.95 and 0.99 in nearly one colour): one row per τ instead, each cell the
    share of that τ's samples exiting at that layer (numpy's), accuracy and speedup beside the row."""
    summary = synthetic_summary(6)
    for row in summary["early_exit"][4:]:
        row["exit_counts"] = [0, 0, 0, 0, 0, 360]  # three τ with the same exits: three equal rows, all visible
    figure = summary_figures(summary)["early_exit"]
    ax = figure.axes[0]
    (image,) = ax.images
    counts = np.array([row["exit_counts"] for row in summary["early_exit"]], dtype=float)
    np.testing.assert_allclose(image.get_array()[:, 2:], counts / counts.sum(axis=1, keepdims=True))
    labels = [label.get_text() for label in ax.get_yticklabels()]
    assert labels == [f"{row['threshold']:g}" for row in summary["early_exit"]], "compact: τ alone"
    written = {(text.get_position(), text.get_text()) for text in ax.texts}
    for index, row in enumerate(summary["early_exit"]):  # accuracy (%) and speedup in the two columns before
        assert ((0, index), f"{100 * row['accuracy']:.0f}") in written and (
            (1, index),
            f"{row['speedup']:.1f}",
        ) in written
    assert len(ax.texts) == counts.size + 2 * len(counts)
    plt.close("all")


# ------------------------------------------------------------------ words, not keys
RAW_KEYS = ("Acc_L", "num_samples", "n_nonfinite", "trajectory_lss", "cos_to_last", "tau_", "eps_", "val_corrupted")


def raw_keys(text: str) -> list[str]:
    """What in ``text`` a reader would take for a program's key: an identifier with an underscore (outside mathtext
    ``$...$`` and file paths), a known key, or the stage ``val`` as a word."""
    words = re.sub(r"\$[^$]*\$", " ", text)
    found = [k for k in RAW_KEYS if k in words]
    found += [w for w in re.findall(r"[\w/.]*[A-Za-z0-9]_[A-Za-z0-9][\w/.]*", words) if "/" not in w]
    found += re.findall(r"\bval\b", words)
    return found


def every_text(figure) -> list[str]:
    return [text.get_text() for text in figure.findobj(Text) if text.get_text().strip()]


@pytest.mark.parametrize("width", ["column", "page"])
def test_no_raw_key_in_any_figure_text(width):
    """Every text of every figure the package draws, a corrupted validation's included: no ``per-sample COS(h_l,
    h_L)``, ``Acc_L`` or "val_corrupted epoch 9"; subscripts are mathtext."""
    with drawn_at(width):
        figures = every_figure(6)
        corrupted = dict(synthetic_summary(6), stage="val_corrupted")
        figures.update({f"corrupted {name}": f for name, f in summary_figures(corrupted).items()})
        from test_figures import synthetic_charts

        from layerwise.figures.curves import chart_figures

        figures.update(chart_figures("val_corrupted", synthetic_charts(6)))
    keys = {
        name: found
        for name, figure in figures.items()
        if (found := [k for t in every_text(figure) for k in raw_keys(t)])
    }
    assert not keys, keys
    texts = [t for figure in figures.values() for t in every_text(figure)]
    assert any("validation (corrupted), epoch 31" in t for t in texts)
    plt.close("all")


def test_the_checker_finds_the_keys_of_380d8c9():
    for text in (
        "per-sample COS(h_l, h_L)",
        "Acc ≥ Acc_L − ε",
        "val_corrupted epoch 9, step 4",
        "val epoch 31",
        "num_samples 360 · n_nonfinite 0 · trajectory_lss 1.57",
    ):
        assert raw_keys(text), text
    for text in ("per-sample COS$(h_l, h_L)$", "quickstart/version_0 · validation, epoch 31", "τ 0.95", "layer 3"):
        assert not raw_keys(text), text


def test_the_console_table_names_the_stage_in_words():
    from types import SimpleNamespace

    from layerwise.callbacks._output import layer_table

    table = layer_table("val_corrupted", 9, 40, {"accuracy": [0.5, 0.9]}, SimpleNamespace(layer_numbers=[1, 2]))
    assert table.splitlines()[0] == "layerwise validation (corrupted), epoch 9, step 40:"
    assert not [k for line in table.splitlines() for k in raw_keys(line)]


def synthetic_run(folder: Path) -> Path:
    """A run folder with two validations of a 6-layer model on clean and corrupted data, and a test."""
    for stage, epochs in (("val", (0, 1)), ("val_corrupted", (0, 1)), ("test", (1,))):
        for epoch in epochs:
            summary = dict(synthetic_summary(6), stage=stage, epoch=epoch, global_step=23 * (epoch + 1))
            summary["n_nonfinite"] = 0
            path = summary_path(str(folder), stage, epoch, 23 * (epoch + 1))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(summary))
    return folder


def rendered_report(page: str) -> dict[str, str]:
    """What report.js writes into the page (element id -> HTML), run by node against a stand-in document."""
    scripts = dict(re.findall(r'<script type="application/json" id="(\w+)">(.*?)</script>', page, re.S))
    script = page.rsplit("<script>", 1)[1].split("</script>")[0]
    ids = sorted(set(re.findall(r"\bid=\"?(\w+)", page)))
    harness = (
        "const payload = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "const els = {};"
        "for (const id of payload.ids) els[id] = {textContent: payload.json[id] || '', innerHTML: '', value: '0',"
        " max: '', addEventListener() {}};"
        "global.document = {getElementById: (id) => els[id] || null, querySelectorAll: () => []};"
        "eval(payload.script);"
        "const out = {}; for (const id of payload.ids) out[id] = els[id].innerHTML; console.log(JSON.stringify(out));"
    )
    payload = json.dumps({"ids": ids, "json": scripts, "script": script})
    done = subprocess.run([NODE, "-e", harness], input=payload, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def visible_text(markup: str) -> str:
    """The text of HTML as a reader sees it: no tags, no attributes, no scripts."""
    markup = re.sub(r"<script.*?</script>", " ", markup, flags=re.S)
    markup = re.sub(r"<style.*?</style>", " ", markup, flags=re.S)
    alts = " ".join(re.findall(r'alt="([^"]*)"', markup))
    return re.sub(r"<[^>]+>", " ", markup) + " " + alts


@pytest.mark.skipif(NODE is None, reason="node runs report.js")
def test_no_raw_key_in_the_report(tmp_path):
    """The report's captions, headings and the tables and charts its script draws say stages and numbers in words:
    no "val_corrupted", no ``num_samples · n_nonfinite · trajectory_lss``."""
    from layerwise.figures.report import write_report

    out, _ = write_report(synthetic_run(tmp_path / "run"))
    page = out.read_text(encoding="utf-8")
    drawn = rendered_report(page)
    assert "validation (corrupted)" in drawn["tables"] and "samples 360" in drawn["tables"]
    text = visible_text(page) + " " + " ".join(visible_text(html) for html in drawn.values())
    keys = raw_keys(text)
    assert not keys, sorted(set(keys))


# ------------------------------------------------------------------ one colour per quantity and per layer
def legend_colours(html: str) -> dict[str, str]:
    """name -> colour of every series in the legends report.js drew."""
    pairs = re.findall(r'<i class="sw" style="background:(#[0-9a-fA-F]{6})"></i>([^<]+)</span>', html)
    found: dict[str, set] = {}
    for colour, name in pairs:
        found.setdefault(name, set()).add(colour.lower())
    return {name: colours.pop() for name, colours in found.items() if len(colours) == 1}


@pytest.mark.skipif(NODE is None, reason="node runs report.js")
def test_one_colour_per_quantity_and_per_layer_in_figures_report_and_tensorboard(tmp_path):
    """Accuracy, COS and CKA have one colour each, the same in the figures and the report's charts (which used
    tab10's blue, orange and green, the orange-green pair a deuteranope hardly tells apart); each layer has one
    colour in the figures, the report's curves and TensorBoard's chart images (callbacks/_loggers.py draws those
    through figures/curves.py)."""
    from test_figures import synthetic_charts

    from layerwise.figures.curves import chart_figures
    from layerwise.figures.report import write_report

    quantity = {name: QUANTITY_COLOURS[key] for name, key in (("accuracy", "accuracy"), ("COS", "cos"), ("CKA", "cka"))}
    # the figures
    figure = summary_figures(synthetic_summary(6))["similarity_accuracy"]
    lines = {line.get_label().split()[0]: to_hex(line.get_color()) for ax in figure.axes for line in ax.lines}
    assert {name: lines[name] for name in quantity} == {name: colour.lower() for name, colour in quantity.items()}
    layers = [to_hex(layer_colour(layer, 6)) for layer in range(1, 7)]
    saturation = summary_figures(synthetic_summary(6))["saturation"]
    assert [to_hex(bar.get_facecolor()) for bar in saturation.axes[0].patches] == layers
    # the report
    out, _ = write_report(synthetic_run(tmp_path / "run"))
    drawn = rendered_report(out.read_text(encoding="utf-8"))
    profile = legend_colours(drawn["tables"])
    assert {name: profile[f"{name} to last" if name != "accuracy" else name] for name in quantity} == {
        name: colour.lower() for name, colour in quantity.items()
    }
    curves = legend_colours(drawn["curvecharts"])
    assert [curves[f"layer {layer}"] for layer in range(1, 7)] == layers
    # TensorBoard's chart images
    charts = chart_figures("val", synthetic_charts(6))["layerwise val/accuracy per layer"]
    assert [to_hex(line.get_color()) for line in charts.axes[0].lines] == layers
    # no colour of tab10 in the report's script or meta (its orange and green were the flagged pair)
    tab10 = {to_hex(f"tab:{name}") for name in ("blue", "orange", "green", "red", "purple")}
    used = {c.lower() for html in drawn.values() for c in re.findall(r"#[0-9a-fA-F]{6}", html)}
    assert not used & tab10, used & tab10
    plt.close("all")


def test_the_report_embeds_figures_at_150_dpi_shown_at_their_print_size(tmp_path):
    """The report embedded its PNGs at 80 dpi: now at 150 dpi, each shown as wide as it prints (CSS inches)."""
    import io

    from PIL import Image

    from layerwise.figures.report import FIGURE_DPI, write_report

    assert FIGURE_DPI >= 150
    run = synthetic_run(tmp_path / "run")
    for width, inches in (("column", 3.3), ("page", 6.9)):
        out, _ = write_report(run, tmp_path / f"{width}.html", width=width)
        page = out.read_text(encoding="utf-8")
        images = re.findall(r'style="width:([\d.]+)in" src="data:image/png;base64,([^"]+)"', page)
        assert len(images) >= 10
        for shown, data in images:
            image = Image.open(io.BytesIO(base64.b64decode(data)))
            assert image.info["dpi"][0] == pytest.approx(FIGURE_DPI, abs=0.5)
            assert image.size[0] / FIGURE_DPI == pytest.approx(inches, abs=0.02) == float(shown)


# ------------------------------------------------------------------ runs side by side, in the house style
@pytest.mark.parametrize("width", ["column", "page"])
def test_runs_side_by_side_are_drawn_in_the_house_style(tmp_path, width):
    """``layerwise plot RUN...`` drew its groups in tab10's blue and orange, under "validation epoch 1 (the last),
    bands: 95 % CI", with ε-effective depth as sloped lines between ε labelled as the relative depth it is not. Now:
    the groups in the colour-blind series palette (line and band alike), the stage and the interval in words,
    ε-effective depth a step plot of whole layers at the ε measured; at the print width asked for."""
    from test_figures import synthetic_runs

    from layerwise.figures.overlay import comparison_figures, load_comparison
    from layerwise.figures.style import SERIES_PALETTE

    with drawn_at(width):
        figures = comparison_figures(load_comparison(synthetic_runs(tmp_path, 6)))
    neural_collapse = {"cdnv", "nc2_equinorm", "nc2_equiangular", "nc2_etf", "nc3", "nc4_agreement"}
    assert set(figures) == {"accuracy", "cos", "cka", "nc1", "effective_depth", "early_exit", *neural_collapse}
    tab10 = {to_hex(f"tab:{name}") for name in ("blue", "orange", "green", "red")}
    for name, figure in figures.items():
        assert figure.get_size_inches()[0] == pytest.approx(PRINTS[width].width), name
        (ax,) = figure.axes
        colours = [to_hex(line.get_color()) for line in ax.get_lines()]
        assert colours == [c.lower() for c in SERIES_PALETTE[:2]], (name, colours)
        bands = [to_hex(band.get_facecolor()[0]) for band in ax.collections if isinstance(band, PolyCollection)]
        assert bands and set(bands) <= set(colours) and not set(bands) & tab10, (name, bands)
        title = ax.get_title().replace("\n", " ")
        assert "validation, epoch 1 (the last)" in title and "95 % confidence interval over seeds" in title, title
        legend = named_groups(figure)  # the legend's entries, or the groups' direct labels at their lines' ends
        expected = ["standard (n = 3)", "alternating aligned (n = 3)", "mean ± 95 % t-interval, n = 3; dots: each seed"]
        assert set(expected) <= set(legend), (name, legend)  # in reading order by rows, so not in list order
    depth = figures["effective_depth"].axes[0]
    assert all(line.get_drawstyle() == "steps-post" for line in depth.get_lines())
    assert [label.get_text() for label in depth.get_xticklabels()] == ["0.01", "0.05", "0.1"]
    assert all(float(tick).is_integer() for tick in depth.get_yticks())
    assert "1 - " in depth.get_xlabel(), "the summary's effective_depth is accuracy >= 1 - ε, not the relative one"
    plt.close("all")


def test_no_raw_key_in_a_comparison_whose_runs_differ_by_an_identifier(tmp_path):
    """Runs that differ by ``data.init_args.batch_size`` were labelled ``batch_size=32`` in the legend and the
    table: now ``batch size=32``, and no text of any comparison figure holds a key."""
    from test_figures import synthetic_runs

    from layerwise.figures.overlay import comparison_figures, load_comparison, table_texts

    data = {"standard": {"batch_size": 32}, "aligned": {"batch_size": 64}}
    comparison = load_comparison(synthetic_runs(tmp_path, 6, data=data))
    assert [group.label for group in comparison.groups] == [
        "batch size=32, standard",
        "batch size=64, alternating aligned",
    ]
    figures = comparison_figures(comparison)
    keys = {
        name: found
        for name, figure in figures.items()
        if (found := [k for t in every_text(figure) for k in raw_keys(t)])
    }
    assert not keys, keys
    assert "batch_size" not in table_texts(comparison)["comparison.md"]
    plt.close("all")


@pytest.mark.parametrize("width", ["column", "page"])
def test_the_early_exit_label_keeps_room_for_the_saved_png(width):
    """The τ axis label sits at least 0.1 in inside the canvas when drawn: the PNGs are saved at 150 dpi, whose
    hinting lays the long tick labels ("0.95 (0.442, ×1.00)") out up to 0.06 in wider and pushed it off (seen at
    3.3 in; it sat 0.05 in inside)."""
    with drawn_at(width):
        figure = summary_figures(synthetic_summary(6))["early_exit"]
    figure.canvas.draw()
    label = figure.axes[0].yaxis.label
    assert label.get_window_extent(figure.canvas.get_renderer()).x0 / figure.dpi >= 0.1
    plt.close(figure)
