"""The errors of layerwise below its command line: its own error for a mistake in what the user gave.

:class:`UsageError` is what the package's own checks raise (``layerwise`` prints it in one line naming the option:
``layerwise.cli.errors``), :class:`LayerwiseWarning` what it warns with; :func:`lightning_lines_silenced` drops
Lightning's log lines that a command's own work causes (``stitch``'s per-pair "fit stopped").
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager


class UsageError(ValueError):
    """A mistake in the user's input (data, checkpoint) found once a run has started, before any step runs.

    Raised from inside Lightning's run (a module's ``setup``, the checkpoint restore), where the CLI's parser no longer
    answers; ``layerwise`` prints it in one line naming the option, like a parser error. A ValueError, so callers
    that catch ValueError still do.
    """


class LayerwiseWarning(UserWarning):
    """What layerwise itself warns about (a run that goes on, but not as asked): one category for all of them.

    A UserWarning, so filters on UserWarning still apply;
    ``warnings.filterwarnings("error", category=LayerwiseWarning)`` turns them into errors (the test suite does),
    ``"ignore"`` silences layerwise's alone.
    """


DEBUG_VARIABLE = "LAYERWISE_DEBUG"


_LIGHTNING_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _LinesDropped(logging.Filter):
    """Drops the log records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefixes)


def drop_lightning_lines(*prefixes: str) -> logging.Filter:
    """Lightning's log lines starting with ``prefixes``, dropped from now on; returns the filter that drops them."""
    noise = _LinesDropped(prefixes)
    for name in _LIGHTNING_LOGGERS:
        logging.getLogger(name).addFilter(noise)
    return noise


@contextmanager
def lightning_lines_silenced(*prefixes: str) -> Iterator[None]:
    """Lightning's log lines starting with ``prefixes``, dropped inside the block.

    For a command's own noise, named where it is used (``stitch``: "`Trainer.fit` stopped" after every pair).
    """
    noise = drop_lightning_lines(*prefixes)
    try:
        yield
    finally:
        for name in _LIGHTNING_LOGGERS:
            logging.getLogger(name).removeFilter(noise)
