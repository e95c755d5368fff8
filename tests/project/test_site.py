"""The documentation site as a user opens it: pages a user scans, and the built site working offline from file://.

Fast: each task page starts with its command or code (the first fenced block before any prose section), has
subheadings (a table of contents), and mkdocs.yml asks for no font from the internet. Slow (needs Chromium and
playwright, as tests/figures/test_report.py): the site is built strictly, the install page and a task page are opened
from file:// in headless Chromium and photographed, search answers there, and no page requests anything beyond the
file system (``LAYERWISE_SITE_SCREENSHOTS=DIR`` keeps the screenshots, e.g. as CI artifacts).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import chromium_context, playwright_or_skip

ROOT = Path(__file__).resolve().parents[2]
# the task pages this issue ordered as command, outputs, measured figures (others keep their own order for now)
TASK_PAGES = ["install.md", "main-job.md", "compare.md", "coupling.md", "early-exit.md"]


def config() -> dict:
    class Loader(yaml.SafeLoader):  # mkdocs.yml's !!python/name tags are not needed here
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


@pytest.mark.parametrize("name", TASK_PAGES)
def test_a_task_page_starts_with_its_command_and_has_subheadings(name):
    lines = (ROOT / "docs" / name).read_text().splitlines()
    headings = [i for i, line in enumerate(lines) if line.startswith("## ")]
    fence = next(i for i, line in enumerate(lines) if line.startswith("```"))
    assert len(headings) >= 3, f"{name}: {len(headings)} subheadings"
    assert fence < 12 or headings[0] < fence <= headings[0] + 6, f"{name}: the first command is at line {fence + 1}"


def test_the_site_fetches_no_font_and_searches_offline():
    site = config()
    assert site["theme"]["font"] is False
    assert "offline" in site["plugins"] and site["use_directory_urls"] is False
    polyfills = site["extra"]["polyfills"]
    assert polyfills and all("://" not in script and (ROOT / "docs" / script).is_file() for script in polyfills)


@pytest.mark.slow
def test_the_built_site_opens_offline_in_headless_chromium(tmp_path):
    sync_api = playwright_or_skip()
    from PIL import Image

    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stderr[-3000:]
    shots = Path(os.environ.get("LAYERWISE_SITE_SCREENSHOTS", tmp_path / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    messages, requests = [], []
    with sync_api.sync_playwright() as playwright:
        context = chromium_context(playwright, tmp_path / "profile")
        try:
            page = context.new_page()
            page.on("pageerror", lambda error: messages.append(f"pageerror: {error}"))
            page.on("request", lambda request: requests.append(request.url))
            for name in ("install", "compare"):
                page.goto((site / f"{name}.html").as_uri())
                page.wait_for_load_state("load")
                toc = page.locator(".md-sidebar--secondary .md-nav__link").all_inner_texts()
                assert len(toc) >= 3, f"{name}: table of contents {toc}"
                page.screenshot(path=str(shots / f"{name}.png"), full_page=False)
            page.locator(".md-search__input").first.click()
            page.keyboard.type("CPU")  # as a user types: the search worker answers each key
            page.wait_for_selector(".md-search-result__item", state="attached", timeout=30000)
            found = page.locator(".md-search-result__item").all_inner_texts()
            assert any("CPU" in text for text in found), found
            page.screenshot(path=str(shots / "search.png"))
        finally:
            context.close()
    assert messages == []
    assert all(url.startswith(("file:", "data:", "blob:", "about:")) for url in requests), [
        url for url in requests if not url.startswith(("file:", "data:", "blob:", "about:"))
    ]
    for name in ("install", "compare"):
        image = Image.open(shots / f"{name}.png")
        assert image.size == (1300, 900)
        assert len(np.unique(np.asarray(image.convert("L").resize((130, 90))))) > 20, f"{name}: blank screenshot"
    assert re.search(r"layerwise\[vision\]", (site / "install.html").read_text())
