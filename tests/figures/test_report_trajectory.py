"""`layerwise report` shows the prediction trajectory `layerwise lens --trajectory --out RUN` left in a run folder:
drawn from its numbers, its texts escaped, a file that does not fit left out with one warning line."""

import html
import json
import re
from pathlib import Path

import pytest
from test_figures import synthetic_summary
from test_report import Page

from layerwise.commands.lens import TRAJECTORY_FILES, write_trajectory
from layerwise.figures.lens import check_trajectory
from layerwise.figures.report import write_report
from layerwise.results import summary_path

HOSTILE = "<img src=x onerror=alert(1)> $x$"


def run_folder(folder: Path) -> Path:
    """A run folder with one validation summary of a 3-layer model."""
    path = summary_path(str(folder), "val", 0, 10)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(dict(synthetic_summary(3), stage="val", epoch=0, global_step=10, n_nonfinite=0)))
    return folder


def trajectory(prompt: str = HOSTILE) -> dict:
    tokens = list(prompt[:6])
    rows = [[0.1 * (r + c) for c in range(len(tokens))] for r in range(3)]
    panel = {"top_ids": [[60] * len(tokens)] * 3, "tokens": [["<b>"] * len(tokens)] * 3}
    panel.update(probability=rows, entropy=rows, kl_to_final=rows)
    return {
        "format": "layerwise.lens_trajectory",
        "prompt": prompt,
        "input_ids": [ord(t) for t in tokens],
        "input_tokens": tokens,
        "positions": list(range(len(tokens))),
        "layers": [1, 2, 3],
        "num_layers": 3,
        "vocab_size": 257,
        "lenses": [{"name": "logit lens", **panel}, {"name": "tuned lens </figure>", **panel}],
    }


def test_the_report_draws_the_trajectory_of_its_run_folder_escaped(tmp_path):
    run = run_folder(tmp_path / "run")
    plain, _ = write_report(run, tmp_path / "before.html")
    assert 'id="trajectory"' not in plain.read_text() and "id=trajectory" not in plain.read_text()
    written = write_trajectory(trajectory(), "probability", run)
    assert [path.name for path in written] == list(TRAJECTORY_FILES)
    out, _ = write_report(run)
    text = out.read_text(encoding="utf-8")
    page = Page(text)
    assert "trajectory" in page.ids
    assert len(page.images) == len(Page(plain.read_text()).images) + 1  # the trajectory's figure, a data URI
    assert all(src.startswith("data:image/png;base64,") for src in page.images)
    assert "<img src=x" not in text and '</figure>"' not in text  # the data reaches the page as text
    assert html.escape(repr(HOSTILE)) in text and html.escape("tuned lens </figure>") in text
    assert '<a href="#trajectory">' in text


@pytest.mark.parametrize(
    "broken, says",
    [
        ({"format": "something else"}, "not a layerwise lens trajectory"),
        ({**trajectory(), "statistic": "probability", "layers": [1, 2]}, "'lenses[0].top_ids'"),
        ({**trajectory(), "statistic": "__import__"}, "'statistic'"),
        ({**trajectory(), "statistic": "entropy", "input_tokens": [1, 2]}, "'input_tokens'"),
    ],
    ids=["format", "rows", "statistic", "tokens"],
)
def test_a_trajectory_that_does_not_fit_is_one_line_naming_the_key(broken, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        check_trajectory(broken, "lens_trajectory.json")


def test_the_report_leaves_out_a_trajectory_that_does_not_fit_with_one_line(tmp_path):
    run = run_folder(tmp_path / "run")
    (run / "lens_trajectory.json").write_text("{not json")
    with pytest.warns(UserWarning, match="leaves the prediction trajectory out") as caught:
        out, _ = write_report(run)
    assert len(caught) == 1 and f"{run / 'lens_trajectory.json'}: not JSON" in str(caught[0].message)
    assert "trajectory" not in Page(out.read_text(encoding="utf-8")).ids
