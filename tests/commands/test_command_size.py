"""Every function of the commands' room is short: a command is named steps (checks, data, trainer options, writing).

Counted from its ``def`` to its last line without its docstring, which for a command is its ``--help`` (one
``Args:`` line per flag); the signature counts, one parameter a line, as ruff formats it. Read from the source.
"""

import ast
from pathlib import Path

from layerwise.cli.app import COMMANDS

REPO = Path(__file__).resolve().parents[2]
MOST_LINES = 80


def code_lines(function: ast.AST) -> int:
    """Lines of ``function`` from ``def`` to its end, less its docstring."""
    lines = function.end_lineno - function.lineno + 1
    first = function.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def long_functions(path: Path, names: set[str] = frozenset()) -> list[str]:
    """``file:function (n lines)`` for each function of ``path`` over MOST_LINES (only ``names``, if given)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (not names or node.name in names):
            if code_lines(node) > MOST_LINES:
                found.append(f"{path.relative_to(REPO)}:{node.name} ({code_lines(node)} lines)")
    return found


def test_every_function_in_commands_is_at_most_80_lines():
    found = [line for path in sorted((REPO / "layerwise" / "commands").glob("*.py")) for line in long_functions(path)]
    assert not found, f"split these into named steps (checks, data, trainer options, writing): {found}"


def test_every_command_function_is_at_most_80_lines_wherever_it_lives():
    """``plot`` and ``report`` live with the figures they draw; their command functions follow the same rule."""
    found = []
    for module, function, _ in COMMANDS.values():
        path = REPO.joinpath(*module.split(".")).with_suffix(".py")
        assert path.is_file(), module
        found += long_functions(path, {function})
    assert not found, found


def test_the_count_leaves_out_the_docstring_and_can_fail(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MOST_LINES))
    short = tmp_path / "short.py"
    short.write_text(f'def f():\n    """Help.\n\n    Args:\n        a: one.\n    """\n{body[: body.rindex(chr(10))]}\n')
    long = tmp_path / "long.py"
    long.write_text(f"def f():\n{body}\n")
    globals()["REPO"], repo = tmp_path, REPO
    try:
        assert long_functions(short) == [] and long_functions(long) == ["long.py:f (81 lines)"]
    finally:
        globals()["REPO"] = repo
