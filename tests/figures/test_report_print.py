"""The report's numbers as a reader sees them in headless Chromium: one count of decimals per column, the exits of
early exit in a column per layer, and NC1 over training on a log axis (slow: a browser)."""

import json
import re

import pytest
from helpers import chromium_context, playwright_or_skip

from layerwise.figures.report import write_report
from layerwise.results import summary_path

pytestmark = pytest.mark.slow  # a browser: .ci/run installs Chromium, then runs these
NC1 = [[60.3, 55.1, 48.2, 41.7, 30.4, 25.2], [4.1, 3.3, 2.7, 2.2, 1.6, 1.2], [3.2, 2.5, 2.0, 1.6, 1.1, 0.81]]


def summaries() -> list[dict]:
    """Three validations of a 6-layer model: NC1 ~60 at epoch 0, a few units after; accuracies such as 1.0 and
    0.5108 in one column; seven early-exit thresholds."""
    out = []
    for epoch, nc1 in enumerate(NC1):
        accuracy = [0.5108, 0.62, 0.7, 0.93125, 0.97, 1.0]
        out.append(
            {
                "stage": "val",
                "epoch": epoch,
                "global_step": 23 * (epoch + 1),
                "num_samples": 360,
                "depth": 6,
                "layers": [1, 2, 3, 4, 5, 6],
                "accuracy": accuracy,
                "loss": [2.31, 1.2, 0.8, 0.3, 0.12, 0.0456],
                "nc1": nc1,
                "cos": [[1.0] * 6 for _ in range(6)],
                "early_exit": [
                    {
                        "threshold": tau,
                        "accuracy": 1.0 if tau == 0.99 else 0.5108 + 0.01 * i,
                        "exit_counts": [29, 127, 36, 14, 14, 140] if i == 0 else [0, 0, 0, 0, 1, 359],
                        "speedup": 1.592 if i == 0 else 1.0,
                    }
                    for i, tau in enumerate((0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99))
                ],
            }
        )
    return out


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    sync_api = playwright_or_skip()
    root = tmp_path_factory.mktemp("report_print")
    run = root / "runs" / "digits" / "version_0"
    for summary in summaries():
        path = summary_path(str(run), "val", summary["epoch"], summary["global_step"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary))
    out, _ = write_report(run, root / "report.html")
    with sync_api.sync_playwright() as playwright:
        context = chromium_context(playwright, root / "profile")
        try:
            tab = context.new_page()
            errors = []
            tab.on("pageerror", lambda error: errors.append(str(error)))
            tab.goto(out.as_uri())
            yield tab
            assert errors == []
        finally:
            context.close()


def table_cells(page, index: int) -> list[list[str]]:
    """The rows of the ``index``-th table of the per-layer section, each as its cells' texts (header rows too)."""
    rows = page.locator("#tables table").nth(index).locator("tr")
    return [rows.nth(i).locator("th, td").all_inner_texts() for i in range(rows.count())]


def data_rows(page, index: int) -> list[list[str]]:
    """The rows of the ``index``-th table of the per-layer section that hold numbers (no header row)."""
    rows = page.locator("#tables table").nth(index).locator("tr")
    return [cells for i in range(rows.count()) if (cells := rows.nth(i).locator("td").all_inner_texts())]


def places(text: str) -> int:
    """How many decimals ``text`` is written with (``×1.592`` -> 3)."""
    match = re.search(r"\.(\d+)", text)
    return len(match.group(1)) if match else 0


def test_each_column_of_numbers_has_one_count_of_decimals(page):
    """A column showed 1.000 beside 0.5108 (four significant digits each); now every cell of a column alike."""
    for index in (0, 1):  # the per-layer table, the early-exit table
        rows = data_rows(page, index)
        for column in zip(*rows):
            decimals = {places(text) for text in column if text != "–"}
            assert len(decimals) == 1, column
    per_layer = table_cells(page, 0)
    accuracy = [row[per_layer[0].index("accuracy")] for row in per_layer[1:]]
    assert accuracy == ["0.511", "0.620", "0.700", "0.931", "0.970", "1.000"]


def test_exits_per_layer_are_a_column_per_layer(page):
    """The exits were one space-separated string ("29 127 36 14 14 140") in one cell."""
    rows = table_cells(page, 1)
    assert rows[0][-1] == "samples exiting at layer" and rows[1] == ["1", "2", "3", "4", "5", "6"]
    assert rows[2] == ["0.50", "0.511", "×1.592", "29", "127", "36", "14", "14", "140"]
    assert rows[-1][0] == "0.99" and rows[-1][3:] == ["0", "0", "0", "0", "1", "359"]


def test_nc1_over_training_is_drawn_on_a_log_axis(page):
    """Epoch 0's NC1 of ~60 flattened the later epochs' 1-4 into a tenth of a linear axis."""
    charts = page.locator("#curvecharts svg")
    titles = [charts.nth(i).locator("text").first.text_content() for i in range(charts.count())]
    (nc1,) = [charts.nth(i) for i, title in enumerate(titles) if title.startswith("validation: NC1")]
    assert "log scale" in nc1.locator("text").first.text_content()
    frame = nc1.locator("rect")
    top, height = float(frame.get_attribute("y")), float(frame.get_attribute("height"))
    later = []
    for d in nc1.locator("path").evaluate_all("(paths) => paths.map((p) => p.getAttribute('d'))"):
        ys = [float(y) for y in re.findall(r"[ML][\d.]+ ([\d.]+)", d)]
        later += ys[1:]  # the validations after the first
    assert (max(later) - min(later)) / height > 0.25, "the later epochs' NC1 squeezed into a thin band"
    assert all(top <= y <= top + height for y in later)
    labels = nc1.locator("text").all_text_contents()
    assert "10" in labels and "1" in labels


def test_curves_colour_each_layer_by_its_number_as_the_figures_do(page, tmp_path):
    """A run that analyses layers 4-6 of 6: their curves have layers 4-6's colours, not layers 1-3's."""
    from matplotlib.colors import to_hex

    from layerwise.figures.style import layer_colour

    run = tmp_path / "run"
    for epoch in (0, 1):
        summary = {"stage": "val", "epoch": epoch, "global_step": 5 * (epoch + 1), "depth": 6, "layers": [4, 5, 6]}
        summary["accuracy"] = [0.5 + 0.1 * epoch, 0.6, 0.7]
        path = summary_path(str(run), "val", epoch, summary["global_step"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary))
    out, _ = write_report(run, tmp_path / "report.html")
    tab = page.context.new_page()  # a second tab of the module's browser
    try:
        tab.goto(out.as_uri())
        chart = tab.locator("#curvecharts svg").first
        strokes = chart.locator("path").evaluate_all("(paths) => paths.map((p) => p.getAttribute('stroke'))")
    finally:
        tab.close()
    assert strokes == [to_hex(layer_colour(layer, 6)) for layer in (4, 5, 6)]
