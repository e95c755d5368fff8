"""Which functions may draw a summary: chosen by code, never by the file.

Each analysis callback names a module-level figure function of its JSON results (``AnalysisCallback.figures``; the
package's own analyses name theirs in :mod:`layerwise.figures.summary`). When it writes its results into an
evaluation's summary it also records that function's name under :data:`FIGURE_FUNCTIONS`, as ``"module:qualname"``
mapped to the summary key it reads (``None``: the whole summary).

A summary only *names* functions: a name is drawn when it is registered, and nothing is imported because a file
names it (a summary is data that anyone can edit). Registered are:

- the package's own figure functions (``PACKAGE_FIGURES`` of :mod:`layerwise.figures.summary`);
- a user's, installed as a plug-in in the entry-point group :data:`ENTRY_POINT_GROUP` (``layerwise.figures``) of
  their package's metadata, loaded only when a summary names a function the package does not have;
- the functions the running code passes itself: the callbacks of a live fit hand their function objects to the
  drawing process with each job, and ``layerwise plot/report --figures module:function`` names functions the user
  typed (:func:`typed_functions`).

Any other name is skipped with one line saying how to register it (:func:`unregistered_line`).
"""

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import metadata
from typing import Any, Optional

from layerwise.errors import UsageError
from layerwise.results import FIGURE_FUNCTIONS

__all__ = [
    "ENTRY_POINT_GROUP",
    "FIGURE_FUNCTIONS",
    "FigureFunction",
    "plugins",
    "recorded",
    "reference",
    "typed_functions",
    "unregistered_line",
]

FigureFunction = Callable[[Any], dict[str, Any]]  # JSON results -> {name: matplotlib figure}

ENTRY_POINT_GROUP = "layerwise.figures"


def reference(function: FigureFunction) -> str:
    """``"module:qualname"`` of a module-level function: the name a summary records it by."""
    return f"{function.__module__}:{function.__qualname__}"


def recorded(functions: Iterable[tuple[FigureFunction, Optional[str]]]) -> dict[str, Optional[str]]:
    """The :data:`FIGURE_FUNCTIONS` entry of ``(function, key)`` pairs, in order, each function once."""
    return {reference(function): key for function, key in functions}


def plugins() -> tuple[dict[str, FigureFunction], list[str]]:
    """The figure functions installed in the entry-point group ``layerwise.figures``, by name; and the failures.

    Each entry point (``name = "module:function"`` in a package's ``[project.entry-points."layerwise.figures"]``)
    is the user's code, installed by the user: it is loaded, and registered under the name a summary records it by
    (:func:`reference`) and under the entry point's value. One that cannot be loaded is a line of the failures.
    """
    found: dict[str, FigureFunction] = {}
    failures: list[str] = []
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            function = entry.load()
        except Exception as error:  # a broken plug-in: the others, and the package's figures, still draw
            failures.append(
                f"the figure plug-in {entry.name} = {entry.value} could not be loaded ({type(error).__name__}: {error})"
            )
            continue
        if callable(function):
            found[entry.value.replace(" ", "")] = function
            found[reference(function)] = function
    return found, failures


def typed_functions(names: Sequence[str], option: str = "--figures") -> list[FigureFunction]:
    """The functions ``"module:function"`` the user typed on the command line (code, like a config's class path).

    A name that cannot be imported is a ``UsageError`` naming ``option``.
    """
    functions = []
    for name in names:
        module_name, colon, qualname = name.partition(":")
        if not colon or not module_name or not qualname:
            raise UsageError(f"`{option}={name}`: give a figure function as module:function (e.g. mypkg.figs:draw).")
        try:
            found: Any = importlib.import_module(module_name)
            for part in qualname.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError) as error:
            raise UsageError(
                f"`{option}={name}` cannot be imported ({type(error).__name__}: {error}); put its module on PYTHONPATH."
            ) from None
        if not callable(found):
            raise UsageError(f"`{option}={name}` is not a function.")
        functions.append(found)
    return functions


def unregistered_line(name: str, where: str = "the summary") -> str:
    """The one line for a figure function a summary names but nobody registered: skipped, and how to register it."""
    return (
        f"layerwise: {where} names the figure function {name[:120]!r}, which is not registered, so it is not drawn; "
        f'to draw your analysis, register it in the entry-point group "{ENTRY_POINT_GROUP}" of your package '
        "(docs/security.md), or name it with --figures module:function."
    )


def registered(
    package: Iterable[FigureFunction], given: Iterable[FigureFunction], named: Mapping[str, Any]
) -> tuple[dict[str, FigureFunction], list[str]]:
    """The functions that may draw a summary naming ``named``, by name; and the lines of plug-ins that failed.

    The package's and the ``given`` ones; the plug-ins are loaded only when ``named`` holds another name.
    """
    functions = {reference(function): function for function in package}
    functions.update({reference(function): function for function in given})
    failures: list[str] = []
    if any(name not in functions for name in named):
        installed, failures = plugins()
        functions = {**installed, **functions}
    return functions, failures
