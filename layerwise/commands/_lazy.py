"""What lets a command's module import without torch, so that its ``--help`` answers at once (issue 23.14)."""

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def no_grad(function: F) -> F:
    """``@torch.no_grad()``, with torch imported when the function runs rather than when its module is imported."""

    @functools.wraps(function)
    def without_gradients(*args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.no_grad():
            return function(*args, **kwargs)

    return without_gradients  # type: ignore[return-value]


# ``if ANNOTATIONS_ONLY:`` guards the imports that only annotations name (torch's Tensor, nn...): never true, like
# ``typing.TYPE_CHECKING``, but jsonargparse executes ``if TYPE_CHECKING:`` blocks when it reads a command's signature,
# which would import torch for a mere ``--help``.
ANNOTATIONS_ONLY = False
