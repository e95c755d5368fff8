"""Layer selection, the way timm's ``indices`` work."""

from collections.abc import Sequence
from typing import Union

from layerwise.errors import UsageError

LayerSelection = Union[int, Sequence[int], None]


def select_layers(layers: LayerSelection, num_layers: int) -> list[int]:
    """Resolve a layer selection to sorted 0-based block indices.

    Args:
        layers: ``None`` for every layer; an int ``n`` for the last ``n`` layers; a list of 0-based block indices,
            negatives counting from the end (``-1`` is the last block).
        num_layers: number of blocks ``L`` of the model.

    Returns:
        Sorted, de-duplicated 0-based indices. The 1-based layer numbers reported to users are these plus one.
    """
    if layers is None:
        return list(range(num_layers))
    if isinstance(layers, int):
        if not 1 <= layers <= num_layers:
            raise UsageError(f"`layers={layers}` asks for the last {layers} layers of a {num_layers}-layer model.")
        return list(range(num_layers - layers, num_layers))
    resolved = set()
    for index in layers:
        if not -num_layers <= index < num_layers:
            raise UsageError(
                f"`layers` holds {index}, outside the {num_layers} blocks (use 0..{num_layers - 1} or negatives)."
            )
        resolved.add(index % num_layers)
    if not resolved:
        raise UsageError("`layers` is an empty list; give None for all layers.")
    return sorted(resolved)
