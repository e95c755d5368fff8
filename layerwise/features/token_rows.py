"""One block run on one token, the other tokens' keys and values held fixed: the row a diagonal Jacobian needs.

``J^l_{t->t}`` is the derivative of the block's output row t with respect to its input row t, the other input rows
fixed. Row t depends on x_t through token t's own query, key and value and through the per-token layers (norms,
MLP); the other tokens' keys and values are constants. So the row is the block run on the single token t (its
position embeddings sliced to t) whose attention takes the other tokens' keys/values from one earlier run of the
block on the whole prompt: one query against T keys instead of T queries, what a KV cache does for a causal LM,
and the same for an encoder (the keys of every token, the mask's row t).

The split is made where every family already meets: Hugging Face models call their attention through
``AttentionInterface`` (a function registered here is swapped into the block's attention modules' config for the
duration, eager or SDPA alike); timm blocks call ``torch.nn.functional.scaled_dot_product_attention`` (patched for
the duration, ``fused_attn`` forced on). The capture run keeps each attention call's keys/values (after RoPE and
any key norm), mask and causality; the one-token run then computes ``softmax(q_t K^T s + m_t) V`` with token t's
own key and value as the variables and the others constant. :func:`split_block` refuses (returns the reason) when
the one-token row differs from the whole-prompt run's row t, or the block does not run on one token.
"""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from layerwise.features.hooks import block_output

_NAME = "layerwise_token_rows"
# Keyword arguments holding one entry per token, and the dimension to slice: (B, T), (T,), ((B, T, h), (B, T, h)).
_PER_TOKEN = {"position_ids": -1, "cache_position": 0, "position_embeddings": -2, "rotary_pos_emb": -2}
_UNSUPPORTED = ("softcap", "s_aux", "sinks", "position_bias")


@dataclass
class _Keys:
    """One attention call of the whole-prompt run: keys/values (B, H_kv, T, h), mask, causality, scale."""

    key: Tensor
    value: Tensor
    mask: Optional[Tensor]
    causal: bool
    scale: float


@dataclass
class _State:
    mode: str  # "capture" or "row"
    token: int = 0
    calls: list[_Keys] = field(default_factory=list)
    used: int = 0
    refused: Optional[str] = None
    originals: dict[int, tuple[Callable[..., Any], str]] = field(default_factory=dict)
    attention_modules: int = 0  # the block's attention modules routed here (HF configs swapped, timm fused_attn)
    stop_after: Optional[int] = None  # a capture run that needs no output stops after this many attention calls


class _Captured(Exception):
    """Raised by a capture run's last attention call when the run's output is not needed (its row is known)."""


_ACTIVE: list[_State] = []


def _one_query(query: Tensor, key: Tensor, value: Tensor, keys: _Keys, token: int) -> Tensor:
    """Token ``token``'s attention output (B, H, 1, h) against the fixed keys of the others and its own key/value.

    Its query is (B, H, 1, h), its own key/value (B, H_kv, 1, h); the whole-prompt run's mask row and causality apply.
    The products with the fixed keys and values are taken head by head as 2-D matrix products: under ``vmap`` the
    tangents then fold into the rows of each product, where a batched (4-D) product would copy the keys and values
    of every head once per tangent (for GPT-2 4 x 256 at 64 tokens, 16 MiB of copies for a 1 MiB Jacobian).
    """
    num_tokens = keys.key.shape[-2]
    if keys.key.shape[0] != 1:
        raise RuntimeError(f"one prompt at a time: the whole-prompt run had a batch of {keys.key.shape[0]}")
    others = torch.arange(token if keys.causal else num_tokens, device=query.device)
    others = others[others != token]
    repeat = query.shape[1] // key.shape[1]  # grouped KV: query head i reads KV head i // repeat (HF's repeat_kv)
    fixed_key = keys.key[0].index_select(-2, others)  # (H_kv, n, h), constants
    fixed_value = keys.value[0].index_select(-2, others)
    own_key, own_value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    heads = range(query.shape[1])
    scores_others = torch.stack([query[:, i] @ fixed_key[i // repeat].T for i in heads], dim=1) * keys.scale
    score_own = (query * own_key).sum(dim=-1, keepdim=True) * keys.scale  # (B, H, 1, 1)
    if keys.mask is not None:
        row = keys.mask[..., token if keys.mask.shape[-2] > 1 else 0, :]  # (B|1, H|1, T)
        if row.dtype == torch.bool:
            row = torch.zeros(row.shape, dtype=query.dtype, device=row.device).masked_fill(~row, -math.inf)
        row = row.to(query.dtype)
        scores_others = scores_others + row.index_select(-1, others).unsqueeze(-2)
        score_own = score_own + row[..., token : token + 1].unsqueeze(-2)
    weights = torch.softmax(torch.cat([scores_others, score_own], dim=-1), dim=-1)
    mixed = torch.stack([weights[:, i, :, :-1] @ fixed_value[i // repeat] for i in heads], dim=1)
    return mixed + weights[..., -1:] * own_value


def _record(state: _State, query: Tensor, key: Tensor, value: Tensor, mask: Any, causal: bool, scale: Any) -> None:
    if not isinstance(mask, (Tensor, type(None))):
        state.refused = f"an attention mask of type {type(mask).__name__}"
        return
    scale = query.shape[-1] ** -0.5 if scale is None else float(scale)
    state.calls.append(_Keys(key.detach(), value.detach(), None if mask is None else mask.detach(), causal, scale))
    if len(state.calls) == state.stop_after:
        raise _Captured


def _next_keys(state: _State) -> _Keys:
    if state.used >= len(state.calls):
        raise RuntimeError("the one-token run calls attention more often than the whole-prompt run")
    state.used += 1
    return state.calls[state.used - 1]


def _hf_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Any, **kwargs: Any):
    """The ``AttentionInterface`` function swapped in: records (capture) or answers one query (row)."""
    state = _ACTIVE[-1]
    if state.mode == "capture":
        original, implementation = state.originals[id(module)]
        if any(kwargs.get(name) is not None for name in _UNSUPPORTED):
            state.refused = f"attention with {[name for name in _UNSUPPORTED if kwargs.get(name) is not None]}"
        is_causal = kwargs.get("is_causal")
        is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
        # HF's SDPA function is causal only without a mask; the eager one only masks (its mask holds causality).
        causal = implementation != "eager" and attention_mask is None and bool(is_causal) and query.shape[2] > 1
        _record(state, query, key, value, attention_mask, causal, kwargs.get("scaling"))
        return original(module, query, key, value, attention_mask, **kwargs)
    output = _one_query(query, key, value, _next_keys(state), state.token)
    return output.transpose(1, 2), None


def _sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
          is_causal: bool = False, scale: Optional[float] = None, enable_gqa: bool = False) -> Tensor:  # fmt: skip
    """``scaled_dot_product_attention`` patched in for blocks that call it directly (timm)."""
    state = _ACTIVE[-1]
    if state.mode == "capture":
        _record(state, query, key, value, attn_mask, bool(is_causal) and query.shape[-2] > 1, scale)
        return _SDPA(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    return _one_query(query, key, value, _next_keys(state), state.token)


_SDPA = torch.nn.functional.scaled_dot_product_attention


def _hf_config(module: nn.Module) -> Any:
    config = getattr(module, "config", None)
    return config if hasattr(config, "_attn_implementation") else None


def _original_attention(module: nn.Module, implementation: str) -> Callable[..., Any]:
    """The attention function the module would call: its file's ``AttentionInterface`` entry or eager function."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    home = sys.modules.get(type(module).__module__)
    interface = getattr(home, "ALL_ATTENTION_FUNCTIONS", ALL_ATTENTION_FUNCTIONS)
    eager = getattr(home, "eager_attention_forward", None)
    if implementation == "eager" or implementation is None:
        if eager is None:
            raise RuntimeError(f"{type(module).__name__}'s file has no eager_attention_forward")
        return eager
    return interface.get_interface(implementation, eager)


@contextmanager
def _attention_split(block: nn.Module, state: _State) -> Iterator[None]:
    """Route the block's attention through this module for the duration (HF configs swapped, timm SDPA patched)."""
    swapped: list[tuple[nn.Module, Any]] = []
    fused: list[tuple[nn.Module, Any]] = []
    hf = [module for module in block.modules() if _hf_config(module) is not None]
    if hf:
        from transformers import AttentionInterface

        AttentionInterface.register(_NAME, _hf_attention)
    try:
        for module in hf:
            config = _hf_config(module)
            implementation = config._attn_implementation
            if implementation == _NAME:  # a nested block already swapped
                continue
            state.originals[id(module)] = (_original_attention(module, implementation), implementation)
            mine = copy.copy(config)
            mine._attn_implementation = _NAME
            swapped.append((module, config))
            module.config = mine
        for module in block.modules():
            if hasattr(module, "fused_attn"):
                fused.append((module, module.fused_attn))
                module.fused_attn = True
        state.attention_modules = len(swapped) if hf else len(fused)
        _ACTIVE.append(state)
        torch.nn.functional.scaled_dot_product_attention = _sdpa if not hf else _SDPA
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = _SDPA
        if _ACTIVE and _ACTIVE[-1] is state:
            _ACTIVE.pop()
        for module, config in swapped:
            module.config = config
        for module, value in fused:
            module.fused_attn = value


def _per_token(name: str, value: Any, token: int) -> Any:
    """Keyword argument ``name`` cut to token ``token`` when it holds one entry per token."""
    if name not in _PER_TOKEN or value is None:
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(_per_token(name, item, token) for item in value)
    return value.narrow(_PER_TOKEN[name], token, 1)


@dataclass
class SplitBlock:
    """A block's output row at one token as a function of that token's input alone (see :func:`split_block`).

    ``pullback`` is the function's VJP at the token's input, from the one-token run that checked the row.
    """

    function: Callable[[Tensor], Tensor]
    state: _State
    pullback: Callable[[Tensor], tuple[Tensor]]

    def __call__(self, x: Tensor) -> Tensor:
        """``f(X)_t`` (d,), the residual update at the token, for its input ``x`` (d,)."""
        return self.function(x)


def split_block(
    block: nn.Module,
    hidden: Tensor,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    token: int,
    row: Optional[Tensor] = None,
) -> Union[SplitBlock, str]:
    """The residual update of ``block`` at ``token`` as a function of that token's input, or why it cannot be split.

    Runs the block once on the whole prompt ``hidden`` (T, d) (keeping every attention call's keys/values), then
    once on the token alone (under ``torch.func.vjp``: the result's ``pullback``), and compares the row: a reason
    (str) is returned when they differ by more than 1e-6 (float64) or 1e-4 (other dtypes) of the row's scale, or the
    one-token run fails. The block must be in eval mode and the arguments in its dtype. Call the result inside
    :func:`split_attention` of the same block.

    ``row``: the whole prompt's row at ``token`` where a run of the block on ``hidden`` already gave it (a trace's
    output minus its input, in ``hidden``'s dtype). The whole-prompt run then only keeps the keys/values: it stops
    at the call of the block's last attention module, before the attention products and the MLP on every token,
    and the one-token row is checked against ``row``. Where that check fails, the block is split as without ``row``.
    """
    if row is not None:
        split = _split(block, hidden, args, kwargs, token, row)
        if isinstance(split, SplitBlock):
            return split
    return _split(block, hidden, args, kwargs, token, None)


def _split(
    block: nn.Module, hidden: Tensor, args: tuple[Any, ...], kwargs: dict[str, Any], token: int, whole: Optional[Tensor]
) -> Union[SplitBlock, str]:
    """:func:`split_block` against the known whole-prompt row ``whole``, or against its own whole-prompt run."""
    state = _State("capture", token)
    with _attention_split(block, state), torch.no_grad():
        if whole is None:
            whole = block_output(block(hidden.unsqueeze(0), *args, **kwargs))[0, token] - hidden[token]
        else:
            state.stop_after = state.attention_modules or None
            try:
                block(hidden.unsqueeze(0), *args, **kwargs)
            except _Captured:
                pass
    if state.refused:
        return state.refused
    row_kwargs = {name: _per_token(name, value, token) for name, value in kwargs.items()}

    def update(x: Tensor) -> Tensor:
        state.used = 0
        output = block_output(block(x.view(1, 1, -1), *args, **row_kwargs))[0, 0] - x
        if state.used != len(state.calls):
            raise RuntimeError("the one-token run calls attention less often than the whole-prompt run")
        return output

    state.mode = "row"
    try:
        with _attention_split(block, state), torch.no_grad():
            row, pullback = torch.func.vjp(update, hidden[token])[:2]  # no aux: (output, pullback)
    except Exception as error:  # noqa: BLE001 - any failure of the one-token run means: use the whole prompt
        return f"the one-token run fails ({type(error).__name__}: {str(error).splitlines()[0][:120]})"
    tolerance = 1e-6 if hidden.dtype == torch.float64 else 1e-4
    scale = whole.abs().max().item() + hidden[token].abs().max().item()
    difference = (row - whole).abs().max().item()
    if not difference <= tolerance * max(scale, 1.0):
        return f"its one-token row differs from the whole prompt's by {difference:.1e}"
    return SplitBlock(update, state, pullback)


@contextmanager
def split_attention(block: nn.Module, split: SplitBlock) -> Iterator[None]:
    """Run ``split`` (the one-token function of ``block``) inside this context."""
    with _attention_split(block, split.state):
        yield
