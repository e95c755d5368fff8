"""`layerwise report`: one self-contained HTML file of a real (tiny) fit run, its sections, its errors, and the
file opened, driven and photographed in headless Chromium (slow)."""

import base64
import html
import io
import json
import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from helpers import chromium_context, playwright_or_skip
from PIL import Image

from layerwise.cli import main
from layerwise.figures.report import SECTION_FIGURES, report, write_report
from layerwise.figures.summary import summary_figures
from layerwise.results import load_summary, merge_summary, summary_order

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A 2-epoch fit of a 3-block ViT on digits 0-4 validated on clean and corrupted digits (val, val_corrupted)."""
    from layerwise.cli import LayerwiseCLI

    root = tmp_path_factory.mktemp("report_run")
    LayerwiseCLI(
        args=[
            "fit",
            f"--config={ROOT / 'configs' / 'transfer' / 'digits_vit_standard.yaml'}",
            "--model.init_args.backbone.init_args.embed_dim=16",
            "--model.init_args.backbone.init_args.depth=3",
            "--model.init_args.backbone.init_args.num_heads=2",
            "--data.init_args.num_workers=0",
            "--trainer.max_epochs=2",
            "--trainer.limit_train_batches=3",
            "--trainer.limit_val_batches=2",
            "--trainer.log_every_n_steps=1",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.logger.init_args.save_dir={root}",
        ]
    )
    folder = root / "transfer_standard" / "version_0"
    assert len(list((folder / "layerwise").glob("*.json"))) == 4  # 2 epochs x (val, val_corrupted)
    return folder


class Page(HTMLParser):
    """The parts of the report a test looks at: element ids, images, links, scripts, the config text."""

    def __init__(self, text: str):
        super().__init__()
        self.ids: set[str] = set()
        self.images: list[str] = []
        self.links: list[str] = []
        self.scripts: dict[str, str] = {}
        self.pre: list[str] = []
        self._in: tuple[str, str] = ("", "")
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "img":
            self.images.append(attrs["src"])
        for key in ("src", "href"):
            if key in attrs and tag != "img":
                self.links.append(attrs[key])
        if tag in ("script", "pre"):
            self._in = (tag, attrs.get("id", ""))
            if tag == "pre":
                self.pre.append("")

    def handle_endtag(self, tag):
        self._in = ("", "")

    def handle_data(self, data):
        tag, name = self._in
        if tag == "script":
            self.scripts[name] = self.scripts.get(name, "") + data
        elif tag == "pre":
            self.pre[-1] += data


def summary_files(run: Path) -> list[Path]:
    return sorted((run / "layerwise").glob("*_epoch_*.json"), key=lambda p: (summary_order(p), p.name))


def test_report_holds_the_config_every_summary_and_the_figures_of_the_latest_validation(run, tmp_path, capsys):
    out = tmp_path / "shared" / "report.html"
    main(["report", str(run), "--out", str(out)])
    assert capsys.readouterr().out.splitlines() == [f"layerwise report: run {run}", str(out)]
    page = Page(out.read_text(encoding="utf-8"))

    assert {"config", "table", "tables", "step", "figures", "curves", "curvecharts", "transfer"} <= page.ids
    assert not {"coupling", "comparison", "detection"} & page.ids  # this run has none of them
    # self-contained: no file, server or network behind any link or script
    assert all(link.startswith(("#", "data:")) for link in page.links), page.links
    assert all(src.startswith("data:image/png;base64,") for src in page.images)
    assert set(page.scripts) == {"summaries", "meta", ""}

    files = summary_files(run)
    summaries = json.loads(page.scripts["summaries"])
    meta = json.loads(page.scripts["meta"])
    assert [record["file"] for record in meta["records"]] == [f.name for f in files]
    assert summaries == [load_summary(f) for f in files]  # the blob is the summaries, exactly
    steps = sorted({(s["epoch"], s["global_step"]) for s in summaries})
    assert [tuple(order) for order in meta["steps"]] == steps and len(steps) == 2
    assert tuple(meta["chosen"]) == steps[-1]
    assert meta["stages"] == ["val", "val_corrupted"]
    assert len(meta["layer_colors"]) == 3 and len(set(meta["layer_colors"])) == 3

    # every figure of each stage's latest summary, as a PNG
    latest = [load_summary(f) for f in files if tuple(summary_order(f)) == steps[-1]]
    sectioned = {name for names in SECTION_FIGURES.values() for name in names}
    drawn = [summary_figures(s) for s in latest]
    expected = sum(len(set(figures) - sectioned) for figures in drawn)
    plt.close("all")
    assert len(page.images) == expected >= 14
    for src in page.images:
        image = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        assert image.format == "PNG" and min(image.size) > 100

    config = (run / "config.yaml").read_text(encoding="utf-8")
    assert page.pre == [config] and "DigitsDataModule" in config
    assert out.stat().st_size < 500_000  # docs/loggers-report.md's bound: the figures of one validation only


def test_report_has_typed_options_and_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "usage: layerwise report" in text and "--out OUT" in text and "--step STEP" in text and " path" in text
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert "    report " in capsys.readouterr().out


def test_step_picks_the_validation_whose_figures_are_drawn(run, tmp_path):
    first = load_summary(summary_files(run)[0])
    out, _ = write_report(run, tmp_path / "first.html", step=first["global_step"])
    text = out.read_text(encoding="utf-8")
    meta = json.loads(Page(text).scripts["meta"])
    assert meta["chosen"] == [first["epoch"], first["global_step"]]
    assert f"figures of epoch {first['epoch']}, step {first['global_step']}" in text


def with_sections(run: Path, copy: Path) -> Path:
    """A copy of ``run`` whose val summaries also hold coupling, comparison and detection results (random values)."""
    shutil.copytree(run, copy)
    rng = np.random.default_rng(0)
    for index, file in enumerate(f for f in summary_files(copy) if f.name.startswith("val_epoch_")):
        summary = load_summary(file)
        depth = len(summary["layers"])
        updates = {
            "coupling": {
                "num_prompts": 4,
                "token": -1,
                "ks": [1, 4],
                "form": "jacobian",
                "depth_coupling": rng.uniform(0, 1, (2, depth, depth)),
                "coupling_score": [0.3 + 0.1 * index, 0.5 - 0.1 * index],
                "sigma": np.sort(rng.uniform(0.1, 2, (depth, 15)))[:, ::-1],
                "inverse_sigma_1": rng.uniform(0.5, 1, depth),
                "linearisation_cosine": 0.8,
                "trajectory_lss": 1.2,
                "trajectory_expodistance": 0.1,
                "trajectory_step_norm": rng.uniform(1, 2, depth),
            },
            "compare": {
                "model_b": "b.ckpt",
                "layers_a": summary["layers"],
                "layers_b": summary["layers"],
                "cka": rng.uniform(0, 1, (depth, depth)),
                "arccos_distance": 0.7 - 0.1 * index,
            },
            "detection_ap50": rng.uniform(0, 1, 3),
        }
        merge_summary(file, updates, summary["run_id"])
    return copy


def test_coupling_comparison_and_detection_sections_appear_when_the_run_has_them(run, tmp_path):
    copy = with_sections(run, tmp_path / "run")
    out, _ = write_report(copy)
    assert out == copy / "report.html"
    text = out.read_text(encoding="utf-8")
    page = Page(text)
    assert {"coupling", "couplingcharts", "comparison", "comparisoncharts", "detection", "detectioncharts"} <= page.ids
    sections = (
        ("coupling", SECTION_FIGURES["coupling"]),
        ("comparison", ("compare_cka",)),
        ("detection", ("detection_ap50",)),
    )
    for anchor, names in sections:
        section = text.split(f"<section id={anchor}>")[1].split("</section>")[0]
        assert re.findall(r'data-figure="([^"]+)"', section) == list(names)
    assert json.loads(page.scripts["summaries"]) == [load_summary(f) for f in summary_files(copy)]


def test_bad_input_is_one_line_naming_the_option_and_writes_nothing(run, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    steps = sorted({load_summary(f)["global_step"] for f in summary_files(run)})
    cases = [
        ([str(tmp_path / "nowhere")], "path "),
        ([str(empty)], f"path {empty}: no layerwise/"),
        ([str(summary_files(run)[0])], "is a file: give the run folder"),
        ([str(run), "--out", str(tmp_path)], f"`--out={tmp_path}` is a folder"),
        ([str(run), "--step", "12345"], "`--step=12345`: the run has no validation at that step (it has steps "),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as raised:
            main(["report", *argv])
        assert raised.value.code == 2
        lines = capsys.readouterr().err.splitlines()
        assert lines[0].startswith("layerwise report: error: ") and message in lines[0], lines
    assert f"{steps[0]}, {steps[1]})" in lines[0]
    assert not (run / "report.html").exists() and list(tmp_path.iterdir()) == [empty]


def test_a_failed_report_leaves_the_previous_file_whole(run, tmp_path, monkeypatch):
    out = tmp_path / "report.html"
    out.write_text("previous report")

    def broken(figure):
        raise RuntimeError("drawing failed")

    monkeypatch.setattr("layerwise.figures.report._png", broken)
    with pytest.raises(RuntimeError, match="drawing failed"):
        report(run, out)
    assert out.read_text() == "previous report" and [p.name for p in tmp_path.iterdir()] == ["report.html"]


@pytest.mark.slow
def test_report_opens_in_headless_chromium_without_console_errors(run, tmp_path):
    """Loads the file in headless Chromium, moves the slider to the first validation, takes a screenshot."""
    sync_api = playwright_or_skip()
    out, _ = write_report(run, tmp_path / "report.html")
    first = load_summary(next(f for f in summary_files(run) if f.name.startswith("val_epoch_000")))
    messages, requests = [], []
    with sync_api.sync_playwright() as playwright:
        context = chromium_context(playwright, tmp_path / "profile")
        try:
            page = context.new_page()
            page.on("console", lambda message: messages.append(f"{message.type}: {message.text}"))
            page.on("pageerror", lambda error: messages.append(f"pageerror: {error}"))
            page.on("request", lambda request: requests.append(request.url))
            page.goto(out.as_uri())
            assert page.inner_text("#steplabel") == "epoch 1, step 6 (2 of 2)"
            curve = page.locator("#curvecharts svg").first
            left, width = float(curve.get_attribute("data-left")), float(curve.get_attribute("data-width"))
            assert float(curve.locator("line.marker").get_attribute("x1")) == pytest.approx(left + width)
            page.focus("#step")
            page.keyboard.press("Home")  # the slider to the first validation, as a user's key press
            assert float(curve.locator("line.marker").get_attribute("x1")) == pytest.approx(left)
            assert page.inner_text("#steplabel") == f"epoch 0, step {first['global_step']} (1 of 2)"
            rows = page.locator("#tables table").first.locator("tr")
            header = rows.nth(0).locator("th").all_inner_texts()
            column = header.index("accuracy")
            shown = [float(rows.nth(i + 1).locator("td").nth(column).inner_text()) for i in range(3)]
            assert shown == pytest.approx(first["accuracy"], rel=1e-3)
            charts = page.locator("#curvecharts svg")
            assert charts.count() >= 10  # 5+ per-layer values x 2 stages, one line per layer
            assert page.locator("#curvecharts svg").first.locator("path").count() == 3
            legend = page.locator("#curvecharts .legend").first.locator("span").all_inner_texts()
            assert [text.strip() for text in legend] == ["layer 1", "layer 2", "layer 3"]
            screenshot = Path(os.environ.get("LAYERWISE_REPORT_SCREENSHOT", tmp_path / "report.png"))
            page.screenshot(path=str(screenshot), full_page=True)

            sections, _ = write_report(with_sections(run, tmp_path / "sections"))
            page.goto(sections.as_uri())
            page.focus("#step")
            page.keyboard.press("Home")
            # one line per K, the LSS, one per block; the arccos distance, one per layer; one per decoder layer
            for anchor, lines in (("coupling", [2, 1, 3]), ("comparison", [1, 3]), ("detection", [3])):
                charts = page.locator(f"#{anchor}charts svg")
                assert [charts.nth(i).locator("path").count() for i in range(charts.count())] == lines, anchor
            page.screenshot(path=str(screenshot.with_name(screenshot.stem + "_sections.png")), full_page=True)
        finally:
            context.close()
    assert messages == []
    assert all(url.startswith(("file:", "data:")) for url in requests), requests
    image = Image.open(screenshot)
    assert image.format == "PNG" and image.size[0] == 1300 and image.size[1] > 3000
    unique = len(np.unique(np.asarray(image.convert("L").resize((130, 300)))))
    assert unique > 20, "the screenshot is blank"


def test_html_escapes_what_it_shows(run, tmp_path):
    copy = tmp_path / "a<b>run"
    shutil.copytree(run, copy)
    (copy / "config.yaml").write_text("model: </script><img src=x onerror=alert(1)>\n")
    out, _ = write_report(copy)
    page = Page(out.read_text(encoding="utf-8"))
    assert page.pre == ["model: </script><img src=x onerror=alert(1)>\n"]
    assert all(src.startswith("data:") for src in page.images)
    assert html.escape("a<b>run") in out.read_text(encoding="utf-8")
    assert json.loads(page.scripts["meta"])["run"] == str(copy)


def test_a_users_per_layer_results_are_a_column_and_curves_of_the_report(run, tmp_path):
    """A user's analysis in more= reaches the report's table and curves through the summary's ``analyses`` record."""
    sync_api = playwright_or_skip()
    copy = tmp_path / "user"
    shutil.copytree(run, copy)
    title = "<b>mean squared norm</b>"  # shown as text, never as markup
    for index, file in enumerate(summary_files(copy)):
        summary = load_summary(file)
        values = [1.0 + index + layer for layer in range(len(summary["layers"]))]
        record = {"class": "user.MeanSquaredNorm", "options": {}, "columns": {"mean_squared_norm": title}}
        merge_summary(file, {"mean_squared_norm": values, "analyses": {"mean_squared_norm": record}}, summary["run_id"])
    assert set(load_summary(file)["analyses"]) > {"mean_squared_norm", "logit_lens"}  # merged with the package's
    out, _ = write_report(copy, tmp_path / "report.html")
    last = load_summary(sorted(f for f in summary_files(copy) if f.name.startswith("val_epoch_"))[-1])
    with sync_api.sync_playwright() as playwright:
        context = chromium_context(playwright, tmp_path / "profile")
        try:
            page = context.new_page()
            page.goto(out.as_uri())
            rows = page.locator("#tables table").first.locator("tr")
            header = rows.nth(0).locator("th").all_inner_texts()
            assert "accuracy" in header and title in header
            column = header.index(title)
            shown = [float(rows.nth(i + 1).locator("td").nth(column).inner_text()) for i in range(3)]
            assert shown == pytest.approx(last["mean_squared_norm"])
            titles = page.locator("#curvecharts svg text").all_text_contents()
            assert any(title in text for text in titles)
        finally:
            context.close()
