"""A report of summaries whose every string is a script canary, opened in headless Chromium (slow): nothing runs.

Every string field of two validations' summaries, the run's config and the run folder's own name carry markup that
would set the page's title, a global and open a dialog if it ever became markup. The report, opened in Chromium,
shows them as text: no handler runs, its Content-Security-Policy is there (its one script allowed by hash, which
still draws the tables), and nothing is requested beyond the file. The same page without its CSP meta tag runs
nothing either: the escaping alone holds. The runs side by side (``report RUN RUN``, no script at all) likewise.
"""

import base64
import hashlib
import json
import re
from pathlib import Path

import pytest
from helpers import chromium_context, playwright_or_skip

from layerwise.cli import main
from layerwise.results import FIGURE_FUNCTIONS

CANARY = "window.__pwned=1;document.title='pwned';alert(1)"
SCRIPTS = (
    f'<img src=x onerror="{CANARY}">',
    f"<script>{CANARY}</script>",
    f"</script><script>{CANARY}</script>",
    f'<svg onload="{CANARY}"></svg>',
    f"\"><iframe srcdoc='<script>parent.{CANARY}</script>'></iframe>",
    f'<a href="javascript:{CANARY}" id=canarylink>x</a>',
    "{{ title }}${CANARY}",
)
SCRIPT = "".join(SCRIPTS)
FOLDER = "run<img src=x onerror=window.__pwned=2>"  # a run folder's name is shown too


def scripted(value):
    if isinstance(value, str):
        return value + SCRIPT
    if isinstance(value, list):
        return [scripted(item) for item in value]
    if isinstance(value, dict):
        return {key: scripted(item) for key, item in value.items()}
    return value


def summary(step: int) -> dict:
    from test_figures import synthetic_coupling

    coupling = synthetic_coupling(3)
    coupling.update(token=SCRIPT, form=SCRIPT)
    written = {
        "run_id": "run",
        "layerwise_version": "0.2.0",
        "stage": "val",
        "split": "validation",
        "epoch": step,
        "global_step": step,
        "num_samples": 10,
        "depth": 3,
        "layers": [1, 2, 3],
        "cos": [[1.0, 0.5, 0.2], [0.5, 1.0, 0.6], [0.2, 0.6, 1.0]],
        "accuracy": [0.2, 0.5, 0.9 - 0.1 * step],
        "loss": [2.0, 1.0, 0.5],
        "effective_depth": {"0.05": 3},
        "early_exit": [{"threshold": 0.5, "accuracy": 0.8, "exit_counts": [2, 3, 5], "speedup": 1.4}],
        "detection_ap50": [0.1, 0.2, 0.3],
        "compare": {"model_b": "b.ckpt", "layers_a": [1, 2, 3], "layers_b": [1, 2, 3], "cka": [[1, 0.5, 0.2]] * 3},
        "residual_norm_ratio": {
            "branches": ["block", "attention"],
            "layers": [1, 2, 3],
            "token": "cls",
            "pooling": "mean",
            "mean": [[1.0, 2.0, 3.0], [1.5, 2.5, 3.5]],
            "quantile_levels": [0.25, 0.5, 0.75],
            "quantiles": [[[0.5, 1.0, 1.5]] * 3, [[0.6, 1.1, 1.6]] * 3],
        },
        "mine": {"note": "a user's analysis", "values": ["a", "b"]},
    }
    written = {key: scripted(value) if key not in ("stage",) else value for key, value in written.items()}
    written["coupling"] = coupling
    written[FIGURE_FUNCTIONS] = {"layerwise.figures.summary:similarity_figures": None, SCRIPT: "mine"}
    written["mine"][SCRIPT] = SCRIPT  # a key of a user's analysis too
    return written


def write_run(root: Path, name: str) -> Path:
    run = root / name
    (run / "layerwise").mkdir(parents=True)
    for step in (0, 1):
        path = run / "layerwise" / f"val_epoch_{step:03d}_step_{step:07d}.json"
        path.write_text(json.dumps(summary(step)), encoding="utf-8")
    (run / "config.yaml").write_text(f"model:\n  class_path: a.B\n  note: {json.dumps(SCRIPT)}\nseed_everything: 0\n")
    return run


def open_page(sync_api, page_file: Path, profile: Path) -> dict:
    """Open ``page_file``, move the slider over every validation; what fired, what was asked for, what is shown."""
    fired, requests, messages = [], [], []
    with sync_api.sync_playwright() as playwright:
        context = chromium_context(playwright, profile)
        try:
            page = context.new_page()
            page.on("dialog", lambda dialog: (fired.append(f"dialog {dialog.message}"), dialog.dismiss()))
            page.on("request", lambda request: requests.append(request.url))
            page.on("console", lambda message: messages.append(f"{message.type}: {message.text}"))
            page.on("pageerror", lambda error: messages.append(f"pageerror: {error}"))
            page.goto(page_file.as_uri())
            title = page.title()
            if page.locator("#step").count():
                page.focus("#step")
                page.keyboard.press("Home")
                page.keyboard.press("End")
            page.wait_for_timeout(300)
            shown = {
                "title": page.title(),
                "first_title": title,
                "pwned": page.evaluate("window.__pwned === undefined ? null : window.__pwned"),
                "csp": page.evaluate(
                    "(document.querySelector('meta[http-equiv=\"Content-Security-Policy\"]') || {}).content || null"
                ),
                "handlers": page.evaluate(
                    "[...document.querySelectorAll('*')].flatMap(e => [...e.attributes].filter(a => /^on/i.test(a.name)"
                    " || /^\\s*javascript:/i.test(a.value)).map(a => e.tagName + ' ' + a.name))"
                ),
                "elements": page.evaluate(
                    "[...document.querySelectorAll('script, iframe, a#canarylink, img:not([src^=\"data:\"])')]"
                    ".map(e => e.tagName + (e.type ? ':' + e.type : ''))"
                ),
                "tables": page.locator("#tables table").count(),
                "text": page.inner_text("body"),
            }
        finally:
            context.close()
    return {**shown, "fired": fired, "requests": requests, "messages": messages}


def assert_nothing_ran(shown: dict) -> None:
    assert shown["fired"] == [] and shown["pwned"] is None
    assert shown["title"] == shown["first_title"] != "pwned"  # the folder name is shown in it, as text
    assert shown["handlers"] == []
    assert all(url.startswith(("file:", "data:")) for url in shown["requests"]), shown["requests"]


@pytest.mark.slow
def test_a_report_of_script_canaries_runs_none_of_them_and_carries_its_csp(tmp_path, capsys):
    sync_api = playwright_or_skip()
    run = write_run(tmp_path, FOLDER)
    out = tmp_path / "out" / "report.html"
    main(["report", str(run), "--out", str(out), "--width", "column"])
    text = out.read_text(encoding="utf-8")
    script = re.search(r"<script>(.*?)</script>\s*</body>", text, re.S).group(1)
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")

    shown = open_page(sync_api, out, tmp_path / "profile")
    assert_nothing_ran(shown)
    csp = shown["csp"]
    assert f"script-src 'sha256-{digest}'" in csp and "default-src 'none'" in csp and "img-src data:" in csp
    assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    assert shown["elements"] == ["SCRIPT:application/json", "SCRIPT:application/json", "SCRIPT"]
    assert shown["tables"] >= 2  # the script the CSP allows by its hash ran: it drew the tables
    assert not [m for m in shown["messages"] if "Content Security Policy" in m or "pageerror" in m], shown["messages"]
    for piece in (*SCRIPTS[1:3], FOLDER):  # the canaries are on the page, as text (the config's, the folder's)
        assert piece in shown["text"]

    # the escaping alone holds: the same page without its CSP runs nothing either
    bare = out.with_name("bare.html")
    bare.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", text), encoding="utf-8")
    unguarded = open_page(sync_api, bare, tmp_path / "profile_bare")
    assert unguarded["csp"] is None
    assert_nothing_ran(unguarded)
    assert unguarded["tables"] >= 2


@pytest.mark.slow
def test_the_runs_side_by_side_of_script_canaries_run_none_of_them(tmp_path):
    sync_api = playwright_or_skip()
    runs = [write_run(tmp_path / f"seed{seed}", FOLDER) for seed in (0, 1)]
    for seed, run in enumerate(runs):
        config = (run / "config.yaml").read_text().replace("seed_everything: 0", f"seed_everything: {seed}")
        (run / "config.yaml").write_text(config)
    out = tmp_path / "out" / "report.html"
    main(["report", *map(str, runs), "--out", str(out), "--width", "column"])
    shown = open_page(sync_api, out, tmp_path / "profile")
    assert_nothing_ran(shown)
    assert "script-src 'none'" in shown["csp"]
    assert shown["elements"] == []
