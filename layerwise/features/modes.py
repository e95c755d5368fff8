"""A model in evaluation mode for the length of a ``with`` block, its own mode restored afterwards."""

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in evaluation mode (dropout off, norms frozen) inside the block; its training flag restored after."""
    training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(training)
