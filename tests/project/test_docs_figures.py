"""The docs' pictures are drawn by scripts, in the current style (issue 52).

Six of the nine pictures in ``docs/figures/`` predated the print style (tab10, twin axes, class-name legends) and
nothing said so. Now every picture has the command that draws it (``benchmarks/docs_figures.py``'s ``FIGURES``, a
command the docs name too), and each records the style's version in its PNG text: a picture older than
``layerwise.figures.style.STYLE_VERSION`` fails here until it is drawn again.
"""

import importlib.util
from pathlib import Path

import pytest
from PIL import Image

from layerwise.figures.style import STYLE_VERSION

ROOT = Path(__file__).resolve().parents[2]
PICTURES = sorted((ROOT / "docs" / "figures").glob("*.png"))
# Pictures not drawn again yet with this style version (each needs fits that take minutes; the command beside it
# in benchmarks/docs_figures.py draws it): expected to fail, strictly, so that drawing one makes this list shrink.
STALE: set[str] = set()


def commands() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "benchmarks" / "docs_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FIGURES


def test_every_picture_has_a_command_the_docs_name():
    figures = commands()
    assert {path.name for path in PICTURES} == set(figures), "a picture without a command, or a command without one"
    docs = " ".join(path.read_text(encoding="utf-8") for path in (ROOT / "docs").rglob("*.md"))
    for name, command in figures.items():
        assert command in docs, f"{name}: the docs do not name `{command}`"
        assert f"figures/{name}" in docs, f"{name}: no page shows it"


@pytest.mark.parametrize(
    "picture",
    [
        pytest.param(path, marks=pytest.mark.xfail(strict=True, reason="not drawn again yet"))
        if path.name in STALE
        else path
        for path in PICTURES
    ],
    ids=[path.name for path in PICTURES],
)
def test_each_picture_follows_the_current_style(picture):
    recorded = int(Image.open(picture).info.get("layerwise style", 0))
    assert recorded == STYLE_VERSION, (
        f"docs/figures/{picture.name} records style {recorded}, the style module is at {STYLE_VERSION}: "
        f"draw it again with `{commands()[picture.name]}`"
    )
