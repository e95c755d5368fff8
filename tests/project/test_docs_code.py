"""Every code block in README.md and docs/ runs here, or says why it cannot (the docs cannot go stale).

The collector reads each fenced block and the line right before it:

- ```` ```python ````: run in order with the page's earlier Python blocks, in one namespace, in a temporary folder.
- ```` ```bash ````: every command must be ``layerwise …``; each runs in-process (``layerwise.cli.main``) in one
  shared workspace (no ``configs/``: the docs name the shipped configs, ``--config quickstart``; the quickstart fit
  already run, so ``runs/quickstart/version_0`` exists).
  ``fit``/``validate``/``test``/``predict`` are cut to one epoch of two training batches
  (``--trainer.max_epochs=1 --trainer.limit_train_batches=2``); a command that ran once (README and a page both
  show it) is not run again.
- ```` ```yaml ````: parsed; every ``class_path`` is imported and built with its ``init_args``.
- ```` ```text ```` after ``<!-- output -->``: what the page's block right before it printed; each quoted line
  must be a printed line, in order, "…" standing for the parts that depend on the run (as in the troubleshooting
  table). Other ``text`` blocks and blocks without a language (diagrams) are not code.
- ``<!-- not run: REASON -->`` right before the fence: not run, and REASON must say why (a GPU, a download, hours).
  ``<!-- slow: REASON -->``: run only with ``pytest -m slow``.
"""

import os
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
CODE = {"python", "bash", "yaml"}
NOT_CODE = {"", "text"}  # diagrams, quoted output
FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!-- (not run|slow|output)(?::\s*(.*?))?\s*-->$")
CUT = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2"]  # what a docs run of a trainer command adds
TRAINER_COMMANDS = {"fit", "validate", "test", "predict"}


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    marker: str = ""  # "not run", "slow", "output" or ""
    reason: str = ""
    earlier: list["Block"] = field(default_factory=list)  # the page's blocks before this one

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def page_blocks(page: Path) -> list[Block]:
    """The fenced blocks of one Markdown page, each with the marker on the line before its fence."""
    lines = page.read_text().splitlines()
    blocks, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        before = next((lines[i].strip() for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = MARKER.match(before)
        block = Block(page, index + 1, opening.group(1), "\n".join(lines[index + 1 : end]) + "\n")
        if marker:
            block.marker, block.reason = marker.group(1), marker.group(2) or ""
        block.earlier = list(blocks)
        blocks.append(block)
        index = end + 1
    return blocks


BLOCKS = [block for page in PAGES for block in page_blocks(page)]
RUNNABLE = [block for block in BLOCKS if block.language in CODE and block.marker != "not run"]


def block_param(block: Block):
    marks = [pytest.mark.slow] if block.marker == "slow" else []
    return pytest.param(block, id=block.id, marks=marks)


# ------------------------------------------------------------------------------------------- what the pages hold


def test_the_pages_hold_code_blocks():
    assert len(BLOCKS) >= 20 and len(RUNNABLE) >= 8, (len(BLOCKS), len(RUNNABLE))


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_every_block_is_code_that_runs_or_says_why_not(block):
    known = CODE | NOT_CODE
    assert block.language in known, f"{block.id}: language {block.language!r}, expected one of {sorted(known)}"
    if block.marker in ("not run", "slow"):
        assert block.language in CODE, f"{block.id}: `{block.marker}` marks a block that is not code"
        assert len(block.reason.split()) >= 3, f"{block.id}: `<!-- {block.marker}: REASON -->` needs its reason"
    if block.marker == "output":
        assert block.language == "text", f"{block.id}: quoted output goes in a ```text block"
        ran = [earlier for earlier in block.earlier if earlier.language in ("bash", "python")]
        assert ran and ran[-1].marker != "not run", f"{block.id}: the output of which block that runs here?"


def test_the_install_block_is_what_ci_runs():
    """README's and the install page's two set-up lines are .ci/run's, verbatim."""
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    for page in (REPO / "README.md", REPO / "docs" / "install.md"):
        first = next(block for block in page_blocks(page) if "pip install -e" in block.code)
        assert first.code.splitlines() == ['pip install -e ".[dev]"', "pytest"], first.id
        assert all(line in ci for line in first.code.splitlines()), f"{first.id} differs from .ci/run"


def test_the_readmes_links_resolve():
    """README is not built by mkdocs (whose --strict checks the pages' links): its relative links and images here."""
    text = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [target for target in targets if "://" not in target]
    assert len(local) >= 10 and all((REPO / target).is_file() for target in local), [
        target for target in local if not (REPO / target).is_file()
    ]


# ------------------------------------------------------------------------------------------- running the blocks


@contextmanager
def inside(folder: Path) -> Iterator[None]:
    """Run in ``folder``, then return to where we were."""
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def commands(code: str) -> list[list[str]]:
    """A bash block's commands: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]


class Workspace:
    """One folder where the docs' commands run in order, each command line at most once."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.outputs: dict[str, str] = {}

    def run(self, words: list[str], capfd) -> str:
        assert words[0] == "layerwise", f"`{shlex.join(words)}` is not a layerwise command: mark its block not run"
        args = words[1:] + (CUT if words[1] in TRAINER_COMMANDS else [])
        key = shlex.join(args)
        if key not in self.outputs:
            from layerwise.cli import main

            capfd.readouterr()
            with inside(self.folder):
                try:
                    main(args)
                except SystemExit as stop:
                    assert stop.code in (0, None), f"`layerwise {key}` exited with {stop.code}:\n{capfd.readouterr()}"
            captured = capfd.readouterr()
            self.outputs[key] = captured.out + captured.err
        return self.outputs[key]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return Workspace(tmp_path_factory.mktemp("docs_workspace"))


@pytest.fixture
def quickstart(workspace, capfd):
    """The workspace after the main job (cut), which later commands read (runs/quickstart/version_0)."""
    workspace.run(["layerwise", "fit", "--config", "quickstart"], capfd)
    return workspace


NAMESPACES: dict[Path, tuple[int, dict]] = {}  # page -> (line of the last Python block run, its namespace)
# a page's first Python block -> the namespace and output it left: README and a page show one example, run once
OPENINGS: dict[str, tuple[dict, str]] = {}
PRINTED: dict[str, str] = {}  # block id -> what it printed


def run_python(block: Block, folder: Path, capfd) -> str:
    """Run the page's Python blocks up to ``block`` in one namespace; what ``block`` printed."""
    done, namespace = NAMESPACES.get(block.page, (0, {"__name__": "__docs__"}))
    for python in [*block.earlier, block]:
        if python.language != "python" or python.marker == "not run" or python.line <= done:
            continue
        if not done and python.code in OPENINGS:  # the same example already ran, from a fresh namespace
            opened, PRINTED[python.id] = OPENINGS[python.code]
            namespace = dict(opened)
        else:
            capfd.readouterr()
            with inside(folder):
                exec(compile(python.code, python.id, "exec"), namespace)  # the docs' own code
            captured = capfd.readouterr()
            PRINTED[python.id] = captured.out + captured.err
            if not done:
                OPENINGS[python.code] = (dict(namespace), PRINTED[python.id])
        done = python.line
    NAMESPACES[block.page] = (done, namespace)
    return PRINTED[block.id]


def build_classes(node) -> int:
    """Build every ``class_path`` of a YAML tree with its ``init_args`` as LightningCLI does (jsonargparse: a nested
    analysis given by its options, ``logit_lens: {thresholds: [...]}``, included); the number of class paths."""
    import importlib

    from jsonargparse import ArgumentParser

    if isinstance(node, dict):
        if "class_path" in node:
            module, _, name = node["class_path"].rpartition(".")
            parser = ArgumentParser(exit_on_error=False)
            parser.add_class_arguments(getattr(importlib.import_module(module), name), "built")
            parser.instantiate(parser.parse_object({"built": node.get("init_args", {})}))
            return 1 + count_class_paths(node.get("init_args", {}))
        return sum(build_classes(value) for value in node.values())
    if isinstance(node, list):
        return sum(build_classes(value) for value in node)
    return 0


def count_class_paths(node) -> int:
    if isinstance(node, dict):
        return ("class_path" in node) + sum(count_class_paths(value) for value in node.values())
    if isinstance(node, list):
        return sum(count_class_paths(value) for value in node)
    return 0


def as_pattern(quoted: str) -> re.Pattern:
    """A quoted line as a regex: "…" matches anything within the line."""
    return re.compile(".*?".join(re.escape(part) for part in quoted.rstrip().split("…")))


def assert_quoted(output_block: Block, printed: str) -> None:
    lines = [line.rstrip() for line in printed.splitlines()]
    at = 0
    for quoted in filter(None, (line.rstrip() for line in output_block.code.splitlines())):
        pattern = as_pattern(quoted)
        found = next((i for i in range(at, len(lines)) if pattern.fullmatch(lines[i])), None)
        assert found is not None, f"{output_block.id}: not printed (in this order): {quoted!r}\nprinted:\n{printed}"
        at = found + 1


@pytest.mark.parametrize("block", [block_param(block) for block in RUNNABLE])
def test_block_runs(block, request, capfd, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # help texts wrap at the terminal's width
    monkeypatch.setenv("LAYERWISE_FIGURES", "thread")  # no drawing process to start (it imports torch: seconds)
    if block.language == "yaml":
        assert build_classes(yaml.safe_load(block.code)) >= 1, f"{block.id}: no class_path to check"
        return
    if block.language == "python":
        printed = run_python(block, tmp_path, capfd)
    else:
        workspace = request.getfixturevalue("quickstart")
        printed = "".join(workspace.run(words, capfd) for words in commands(block.code))
    following = next((later for later in page_blocks(block.page) if later.line > block.line), None)
    if following is not None and following.marker == "output":
        assert_quoted(following, printed)
