"""docs/architecture.md's table of allowed imports, the import-linter contracts and the code agree.

`lint-imports` (run in CI) holds the code to the contracts in pyproject.toml; this test holds the map a newcomer reads
to both: every import between two parts of the package is written in the table, and every edge the table allows is
allowed by the layers contract.
"""

import ast
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "layerwise"
# Small leaf modules any part may use: they import nothing of layerwise.
UTILITIES = {"extras", "_compat", "errors", "hub"}
FACE = {"__main__", "__init__"}  # `python -m layerwise` and the package root


def part_of(module: str) -> str:
    """``layerwise.callbacks.monitor`` -> ``callbacks``; ``layerwise.cli`` -> ``cli``."""
    return module.split(".")[1]


def actual_edges() -> set[tuple[str, str]]:
    edges = set()
    for path in PACKAGE.rglob("*.py"):
        source = part_of(".".join(path.relative_to(REPO).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if source not in FACE and name.startswith("layerwise.") and part_of(name) not in (source, *UTILITIES):
                    edges.add((source, part_of(name)))
    return edges


def documented_edges() -> set[tuple[str, str]]:
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text.split("## The parts", 1)[1].split("\n\n", 2)[1]
    parts = {path.stem if path.is_file() else path.name for path in PACKAGE.iterdir() if not path.name.startswith(".")}
    edges = set()
    for row in table.splitlines()[2:]:
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        source = cells[0].strip("`").rstrip("/").removesuffix(".py")
        allowed = re.sub(r"tests/\S+", "", cells[-1])  # a test's path names its folder, not an allowed import
        if "everything above" in allowed:
            targets = parts - {source, "__main__", "__init__", "py.typed"}
        else:
            targets = {word.split(".")[0] for word in re.findall(r"[a-z_]+(?:\.[a-z_]+)?", allowed)} & parts
        edges |= {(source, target) for target in targets if target not in UTILITIES}
    return edges


def layer_index() -> dict[str, int]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [contract for contract in config["contracts"] if contract["type"] == "layers"]
    return {
        part_of(name.strip()): index
        for index, layer in enumerate(layers["layers"])
        for name in re.split(r"[|:]", layer)
    }


def test_every_import_between_parts_is_in_the_architecture_table():
    missing = sorted(actual_edges() - documented_edges())
    assert not missing, f"docs/architecture.md's 'may import' column lacks these imports of the code: {missing}"


def test_the_table_allows_only_what_the_layers_contract_allows():
    index = layer_index()
    upward = [
        (source, target)
        for source, target in documented_edges()
        if source in index and target in index and index[target] < index[source]
    ]
    # No arrow back up: the early-exit engine that predict_step runs lives in engines/, below the modules.
    assert sorted(upward) == []


def test_the_layers_contract_names_every_part():
    index = layer_index()
    subpackages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    assert subpackages <= set(index), f"parts missing from the layers contract: {sorted(subpackages - set(index))}"


def test_the_command_line_face_stays_thin():
    """cli/app.py holds LayerwiseCLI, the registry and main only (issue 21.1: at most 350 lines; command bodies live
    with what they run, the parser of a command function in cli/parser.py, the CLI's errors in cli/errors.py)."""
    lines = len((PACKAGE / "cli" / "app.py").read_text().splitlines())
    assert lines <= 350, f"layerwise/cli/app.py has {lines} lines"
