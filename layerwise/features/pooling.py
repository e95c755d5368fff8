"""Pooling rules that turn a block's token sequence ``(B, T, d)`` into one feature per sample ``(B, d)``."""

from typing import Literal, Optional

import torch
from torch import Tensor

from layerwise.errors import UsageError

Pooling = Literal["cls", "mean", "last"]
POOLINGS: tuple[str, ...] = ("cls", "mean", "last")


def check_pooling(pooling: str, option: str = "pooling") -> None:
    """Raise a ValueError naming ``option`` if ``pooling`` is not a known rule."""
    if pooling not in POOLINGS:
        raise UsageError(f"`{option}={pooling!r}` is not a pooling rule; choose one of {POOLINGS}.")


def pool_tokens(
    tokens: Tensor, pooling: str, num_prefix_tokens: int = 1, attention_mask: Optional[Tensor] = None
) -> Tensor:
    """Pool ``tokens`` of shape ``(B, T, d)`` to ``(B, d)``; ``(B, d)`` (one token per sample) is returned as is.

    Args:
        tokens: a block's output sequence.
        pooling: ``"cls"`` takes token 0; ``"mean"`` averages the non-prefix tokens (the ones the mask keeps, if a
            mask is given); ``"last"`` takes the last token (the last one the mask keeps, for causal language models).
        num_prefix_tokens: leading class/register tokens that ``"mean"`` skips (timm's convention).
        attention_mask: optional ``(B, T)`` mask of real (1) versus padding (0) tokens.

    A nested tensor (``nn.TransformerEncoder``'s fast path with ``enable_nested_tensor=True`` hands its layers each
    sequence at its own length) is read as the padded sequences with the mask of each one's real tokens.
    """
    if tokens.is_nested:
        tokens, attention_mask = _padded(tokens, attention_mask)
    if tokens.ndim == 2:  # one token per sample (an MLP's block): it is the sample's feature, whatever the rule
        return tokens
    if tokens.ndim != 3:
        raise UsageError(
            f"A block output of shape {tuple(tokens.shape)}: the modules a callback's `blocks` path names must return "
            "(B, T, d) token sequences or (B, d) features; give `blocks` the dotted path of such a module list."
        )
    if pooling == "cls":
        return tokens[:, 0]
    if pooling == "mean":
        if attention_mask is None:
            return tokens[:, num_prefix_tokens:].mean(dim=1)
        mask = attention_mask.to(tokens.dtype).unsqueeze(-1)
        return (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1)
    if pooling == "last":
        if attention_mask is None:
            return tokens[:, -1]
        last = attention_mask.long().cumsum(dim=1).argmax(dim=1)
        return tokens[torch.arange(tokens.shape[0], device=tokens.device), last]
    check_pooling(pooling)
    raise AssertionError("unreachable")


def _padded(tokens: Tensor, attention_mask: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """A nested ``(B, T_b, d)`` as a zero-padded ``(B, T, d)`` and its real tokens' mask (the batch's, if given)."""
    parts = tokens.unbind()
    lengths = torch.tensor([part.shape[0] for part in parts], device=parts[0].device)
    width = attention_mask.shape[1] if attention_mask is not None else int(lengths.max())
    padded = tokens.to_padded_tensor(0.0, (len(parts), width, parts[0].shape[-1]))
    if attention_mask is None:
        attention_mask = torch.arange(width, device=lengths.device) < lengths[:, None]
    return padded, attention_mask
