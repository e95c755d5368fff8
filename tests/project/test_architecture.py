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


# ----------------------------------------------------------------------------------------------------- the one readout
READOUT = "layerwise/engines/readout.py"
# Where a head is called outside the one readout, and why that is not reading an intermediate layer.
HEAD_CALLS_ALLOWED = {
    ("layerwise/features/timm_vit.py", "head"): "the backbone's head itself (its definition)",
    ("layerwise/features/hf.py", "head"): "the backbone's head itself (its definition)",
    ("layerwise/features/hooks.py", "head"): "HookTap.head, the hooked model's head (its definition)",
    ("layerwise/features/clip.py", "_joint"): "CLIP's projection into the joint space: features, not a readout",
    ("layerwise/lightning_modules/base.py", "forward"): "the model's own logits at its last layer",
    ("layerwise/lightning_modules/probes.py", "probe_logits"): "LinearProbes.forward's logits",
    ("layerwise/engines/early_exit.py", "full"): "the full model, timed against early exit",
    ("layerwise/commands/export.py", "check_truncated"): "the full logits at depth d, compared with the export's",
}
MODEL_PARTS = ("features", "metrics", "engines", "callbacks", "lightning_modules", "commands", "cli")


def head_calls(path: Path) -> list[tuple[str, int]]:
    """(innermost function, line) of every call of a head in ``path``: ``x.head(...)``, ``head(...)``,
    ``heads[i](...)``, ``x.head_steps(...)``, ``HeadSteps(...)(...)``."""
    found: list[tuple[str, int]] = []

    def is_head(func: ast.expr) -> bool:
        if isinstance(func, ast.Attribute):
            return func.attr in ("head", "head_steps")
        if isinstance(func, ast.Name):
            return func.id in ("head", "head_steps")
        if isinstance(func, ast.Subscript):
            return isinstance(func.value, ast.Name) and "head" in func.value.id
        return isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "HeadSteps"

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Call) and is_head(node.func):
            found.append((function, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(path.read_text()), "<module>")
    return found


def test_every_layer_is_read_through_the_one_readout():
    """The head reads intermediate layers only in engines/readout.py (docs/architecture.md says so)."""
    calls = {
        (str(path.relative_to(REPO)), function, line)
        for part in MODEL_PARTS
        for path in (PACKAGE / part).rglob("*.py")
        for function, line in head_calls(path)
    }
    assert any(path == READOUT for path, _, _ in calls), "the scan finds no head call even in the one readout"
    outside = sorted(call for call in calls if call[0] != READOUT and call[:2] not in HEAD_CALLS_ALLOWED)
    assert not outside, f"a head applied outside {READOUT} (use chunked_readout / read_layers there): {outside}"
    unused = sorted(set(HEAD_CALLS_ALLOWED) - {call[:2] for call in calls})
    assert not unused, f"allowed head calls that no longer exist (drop them from HEAD_CALLS_ALLOWED): {unused}"
    text = (REPO / "docs" / "architecture.md").read_text()
    assert "every layer is read through the one readout" in " ".join(text.split())


def test_the_hand_off_is_one_type_and_no_callback_unpacks_a_dict():
    """The evaluation steps hand on LayerOutputs; no per-layer key constants or readout dicts remain."""
    keys = ("LOGITS", "PREDICTIONS", "MAX_PROB", "NLL", "EXIT_PREFIX", "EXIT_LOGITS", "SAMPLE_INDEX", "POSITIONS")
    for path in [*(PACKAGE / "callbacks").rglob("*.py"), *(PACKAGE / "lightning_modules").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in ("layerwise.features", "layerwise.features.outputs"):
                assert not {alias.name for alias in node.names} & set(keys), (path, [a.name for a in node.names])
    assert not (PACKAGE / "callbacks" / "_batch.py").exists()


# ------------------------------------------------------------------------------------------------ the analyses' room
def module_imports() -> dict[str, set[str]]:
    """Every package module -> the package modules it imports at module level (also for type checking only: a circle
    there is one all the same), not inside a function; ``from a.b import c`` names ``a.b.c`` when that is a module."""
    modules = {
        ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): path
        for path in PACKAGE.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        body = ast.parse(path.read_text()).body
        body += [child for node in body if isinstance(node, ast.If) for child in node.body]  # if TYPE_CHECKING:
        for node in body:  # module level only
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                found |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                }
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name in modules}
        graph[name] = found - {name}
    return graph


def test_no_import_circle_between_the_package_modules():
    """The house had one (callbacks/_loader.py and callbacks/monitor.py importing each other): none is left."""
    graph = module_imports()
    assert graph["layerwise.callbacks._loader"], "the scan finds no import of _loader"
    circles = []

    def visit(module: str, path: list[str]) -> None:
        for target in graph.get(module, ()):
            if target in path:
                circle = path[path.index(target) :]
                if not any(part.endswith("__init__") for part in circle) and target == min(circle):
                    circles.append(circle)
            elif len(path) < 12:
                visit(target, [*path, target])

    for module in graph:
        if module.startswith(("layerwise.analyses", "layerwise.callbacks")):
            visit(module, [module])
    direct = sorted((a, b) for a in graph for b in graph[a] if a in graph.get(b, ()) and a < b)
    assert not direct and not circles, f"import circles: {direct or circles}"


def test_an_analysis_is_a_plain_object_and_its_options_are_its_own():
    """No analysis imports Lightning; no locals()/inspect rule decides which options an analysis refuses."""
    for path in (PACKAGE / "analyses").rglob("*.py"):
        text = path.read_text()
        assert "lightning" not in text.replace("LightningModule`", ""), f"{path.name} imports Lightning"
    for path in [*(PACKAGE / "analyses").rglob("*.py"), *(PACKAGE / "callbacks").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        calls = {
            node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        }
        assert "locals" not in calls, f"{path.name} reads its options from locals()"
        assert "inspect.signature" not in path.read_text(), f"{path.name} reads options from a signature"
    assert not (PACKAGE / "callbacks" / "monitor.py").exists()
