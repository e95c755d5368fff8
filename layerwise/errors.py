"""The package's own error for a mistake in what the user gave, found when a run starts, before any step."""


class UsageError(ValueError):
    """A mistake in the user's input (data, checkpoint) found once a run has started, before any step runs.

    Raised from inside Lightning's run (a module's ``setup``, the checkpoint restore), where the CLI's parser no longer
    answers; ``layerwise`` prints it in one line naming the option, like a parser error. A ValueError, so callers
    that catch ValueError still do.
    """
