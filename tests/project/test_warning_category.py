"""Every warning layerwise emits is a ``LayerwiseWarning``, and the suite makes it an error unless a test expects it.

The suite's filter (pyproject's ``filterwarnings``) matches the category, not the module a warning is attributed to:
``rank_zero_warn`` and ``stacklevel`` attribute layerwise's warnings to torchmetrics, Lightning or the caller.
"""

import ast
import warnings
from pathlib import Path

import pytest

from layerwise.errors import LayerwiseWarning

PACKAGE = Path(__file__).resolve().parents[2] / "layerwise"
WARNERS = {"rank_zero_warn", "warn"}  # torchmetrics' and Lightning's rank_zero_warn, warnings.warn, WarningCache.warn


def warning_calls(path: Path) -> list[ast.Call]:
    """The calls in ``path`` that emit a warning."""
    calls = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in WARNERS:
                calls.append(node)
    return calls


def names_the_category(call: ast.Call) -> bool:
    """``LayerwiseWarning`` given as the category (keyword, or the second argument of warnings.warn/torchmetrics)."""
    given = [keyword.value for keyword in call.keywords if keyword.arg == "category"] + call.args[1:2]
    return any(isinstance(value, ast.Name) and value.id == "LayerwiseWarning" for value in given)


def test_every_warning_of_the_package_is_a_layerwise_warning():
    calls = {
        f"{path.relative_to(PACKAGE.parent)}:{call.lineno}": call
        for path in PACKAGE.rglob("*.py")
        for call in warning_calls(path)
    }
    assert len(calls) >= 15, sorted(calls)  # the search finds them (21 on 2026-11-27)
    assert [where for where, call in calls.items() if not names_the_category(call)] == []


def test_the_suite_makes_layerwise_warnings_errors_and_pytest_warns_still_catches_them():
    with pytest.raises(LayerwiseWarning):
        warnings.warn("unexpected", LayerwiseWarning, stacklevel=1)
    with pytest.warns(UserWarning, match="expected"):
        warnings.warn("expected", LayerwiseWarning, stacklevel=1)
