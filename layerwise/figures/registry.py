"""Which functions draw a summary: the registry every analysis fills, written into the summary itself.

Each analysis callback names a module-level figure function of its JSON results (``AnalysisCallback.figures``; the
package's own analyses name theirs in :mod:`layerwise.figures.summary`). When it writes its results into an
evaluation's summary it also records that function under :data:`FIGURE_FUNCTIONS`, as ``"module:qualname"`` mapped to
the summary key it reads (``None``: the whole summary, for the per-layer analyses whose results are its top-level
keys). ``layerwise plot`` and ``report`` draw a summary by importing the functions it names, so they draw a user's own
analysis exactly as the training run drew it, without knowing the analysis: nothing here imports a callback.
"""

import importlib
from collections.abc import Callable, Iterable
from typing import Any, Optional

from layerwise.results import FIGURE_FUNCTIONS

__all__ = ["FIGURE_FUNCTIONS", "FigureFunction", "function_of", "recorded", "reference"]

FigureFunction = Callable[[Any], dict[str, Any]]  # JSON results -> {name: matplotlib figure}


def reference(function: FigureFunction) -> str:
    """``"module:qualname"`` of a module-level function, by which another process or ``plot`` imports it."""
    return f"{function.__module__}:{function.__qualname__}"


def function_of(name: str) -> FigureFunction:
    """The function a :func:`reference` names, imported; an ``ImportError`` naming it when it cannot be found."""
    module_name, _, qualname = name.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as error:
        raise ImportError(
            f"the figure function {name} of this summary cannot be imported ({type(error).__name__}: {error}); put "
            "its module on PYTHONPATH to draw it"
        ) from None
    return found


def recorded(functions: Iterable[tuple[FigureFunction, Optional[str]]]) -> dict[str, Optional[str]]:
    """The :data:`FIGURE_FUNCTIONS` entry of ``(function, key)`` pairs, in order, each function once."""
    return {reference(function): key for function, key in functions}
