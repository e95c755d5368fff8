"""TensorBoard draws one line per layer, each in its own colour, with the layers named: opened in headless Chromium.

A short run of the shipped quickstart config, served by ``tensorboard --logdir`` on a free localhost port, its
Time Series ``val/acc`` card photographed in Chromium (driven by playwright, as ``tests/figures/test_report.py``
does) and its pixels counted: one distinct line colour per layer run, the colour TensorBoard gives that run in the
card's table. ``LAYERWISE_TENSORBOARD_SCREENSHOT=path`` keeps the photograph of the card (the docs' figure was taken
so).
"""

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
from helpers import CHROMIUM, free_port, playwright_or_skip
from PIL import Image

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
LAYERS = [f"layer_{n:02d}" for n in range(1, 7)]  # the quickstart's six blocks


def quickstart_run(root: Path, epochs: int) -> Path:
    """The shipped quickstart, ``epochs`` epochs long, logged under ``root``: its version folder."""
    command = [sys.executable, "-m", "layerwise", "fit", "--config", str(CONFIGS / "quickstart.yaml")]
    command += [f"--trainer.max_epochs={epochs}", f"--trainer.logger.init_args.save_dir={root}"]
    command += ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    subprocess.run(command, check=True, cwd=root, capture_output=True, timeout=600)
    return root / "quickstart" / "version_0"


def serve(logdir: Path, port: int, log: Path) -> subprocess.Popen:
    """``tensorboard --logdir`` on 127.0.0.1:``port``, returned once it lists every layer run's ``val/acc``."""
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", str(port)]
    server = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--load_fast", "false"], stdout=log.open("w"), stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as response:
                tags = json.load(response)
            if sum("val/acc/layers" in run_tags for run, run_tags in tags.items() if "/layers/" in run) == len(LAYERS):
                return server
        except OSError:
            pass
        if server.poll() is not None:
            raise AssertionError(f"tensorboard exited: {log.read_text()}")
        time.sleep(1)
    server.terminate()
    raise AssertionError(f"tensorboard did not list the layer runs in 120 s: {log.read_text()}")


def rgb(style: str) -> tuple[int, int, int]:
    """``background-color: rgb(229, 37, 146);`` -> (229, 37, 146)."""
    inside = style[style.index("rgb(") + 4 : style.index(")")]
    return tuple(int(part) for part in inside.split(","))


@pytest.mark.slow
def test_the_val_acc_chart_has_one_line_per_layer_in_its_own_colour_and_the_layers_named(tmp_path):
    sync_api = playwright_or_skip()
    run = quickstart_run(tmp_path, epochs=5)  # later, layers 4-6 agree within a sample: their lines coincide
    assert sorted(folder.name for folder in (run / "layers").iterdir()) == LAYERS
    port = free_port()
    server = serve(tmp_path, port, tmp_path / "tensorboard.log")
    # the deep link a user can open too: no smoothing, the val/acc card, the layer runs only (the run itself draws
    # the model's own val/acc, the last layer's, under layer 06's line)
    query = f"smoothing=0&tagFilter={quote('^val/acc/layers$', safe='')}&runFilter=layers"
    shot = Path(os.environ.get("LAYERWISE_TENSORBOARD_SCREENSHOT", tmp_path / "val_acc.png"))
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1300, "height": 1000})
                page.goto(f"http://127.0.0.1:{port}/?{query}#timeseries")
                card = page.locator("scalar-card").filter(has_text="val/acc").first
                card.wait_for(timeout=60_000)
                outliers = page.get_by_role("checkbox", name="Ignore outliers in chart scaling")
                outliers.uncheck()  # on by default: it would cut the first epochs' values off the axis
                page.get_by_label("Toggle settings side pane").click()  # closed: the card takes the width
                card.get_by_label("Toggle full size mode").click()
                rows = card.locator("tb-data-table-content-row")
                rows.nth(len(LAYERS) - 1).wait_for(timeout=30_000)
                page.wait_for_timeout(2_000)  # the chart's last frame
                table = {}
                for index in range(rows.count()):
                    row = rows.nth(index)
                    name = next(text.strip() for text in row.all_inner_texts()[0].split("\n") if "layer_" in text)
                    table[name.rsplit("/", 1)[-1]] = rgb(row.locator(".row-circle span").get_attribute("style"))
                chart = card.locator("line-chart").first
                chart.screenshot(path=str(tmp_path / "chart.png"))
                card.screenshot(path=str(shot))
            finally:
                browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)

    assert sorted(table) == LAYERS  # the legend: one row per layer, named by its run
    colours = np.array(list(table.values()))
    distances = np.abs(colours[:, None, :] - colours[None, :, :]).max(axis=-1)
    assert (distances + 255 * np.eye(len(LAYERS)) > 40).all(), table  # six different colours
    pixels = np.asarray(Image.open(tmp_path / "chart.png").convert("RGB")).astype(int).reshape(-1, 3)
    drawn = {layer: int((np.abs(pixels - colour).max(axis=-1) <= 10).sum()) for layer, colour in table.items()}
    assert all(count >= 30 for count in drawn.values()), drawn  # every layer's line is on the chart in its colour
    coloured = pixels[pixels.max(axis=-1) - pixels.min(axis=-1) > 60]  # not grey: lines, not axes and grid
    assert white_blend_residual(coloured, colours).mean() > 0.85, "a line colour that is no layer's"


def white_blend_residual(pixels: np.ndarray, colours: np.ndarray, tolerance: float = 40) -> np.ndarray:
    """Whether each pixel is one of ``colours`` blended with the white background (an anti-aliased line's edge)."""
    white = np.full(3, 255.0)
    best = np.full(len(pixels), np.inf)
    for colour in colours.astype(float):
        direction = colour - white
        share = np.clip((pixels - white) @ direction / (direction @ direction), 0, 1)
        best = np.minimum(best, np.abs(pixels - (white + share[:, None] * direction)).max(axis=-1))
    return best <= tolerance
