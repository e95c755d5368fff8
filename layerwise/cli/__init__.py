"""The ``layerwise`` command line, the face of the package: no command body lives here.

- ``app.py``: the :data:`~layerwise.cli.app.COMMANDS` registry (each command's module in ``commands/``) and
  ``main``.
- ``trainer.py``: :class:`LayerwiseCLI` (fit/validate/test/predict), imported only when one of those runs.
- ``parser.py``: a command function as a command line (its jsonargparse parser), shipped configs by name.
- ``help_cache.py``: the ``--help`` of the LightningCLI commands, kept after its first rendering.
- ``errors.py``: the error style, one line naming the option (``LAYERWISE_DEBUG=1``: the traceback), exit code 2.
- ``runs.py``: where a run goes (an evaluation of a checkpoint beside its run; ``config.yaml``, an earlier one kept).
- ``closing.py``: ``ClosingLine``, the one line each command ends with.
- ``summary.py``: ``CountedModelSummary``, Lightning's model summary without the FLOPs it did not count.

Light on import: ``layerwise --help`` and every command's ``--help`` import no torch
(``tests/cli/test_command_help.py``); ``LayerwiseCLI`` imports Lightning on first use.
"""

from typing import Any

from layerwise.cli.app import main

__all__ = ["LayerwiseCLI", "main"]


def __getattr__(name: str) -> Any:
    """``LayerwiseCLI`` on first use, importing Lightning then."""
    if name == "LayerwiseCLI":
        from layerwise.cli.trainer import LayerwiseCLI

        return LayerwiseCLI
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
