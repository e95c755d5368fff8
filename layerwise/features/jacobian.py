"""Exact Jacobians of one transformer block's residual update, per token, for any model the path table knows.

Definitions (Aristide et al., 2024, "Transformer Block Coupling"): the residual stream ``x^l_t`` is the input of
block l+1 at token t (``x^0`` the embeddings) and ``X^l = X^{l-1} + f^l(X^{l-1})``. The block Jacobian is

    J^l_{t1->t2} = d f^l(X^{l-1})_{t2} / d x^{l-1}_{t1}  (d x d)

the block *without* its skip connection: the identity is subtracted at t1 = t2, and there is no skip term at
t1 != t2. It is 0 for t1 > t2 in a causal model.

How: :func:`trace_blocks` runs the model once on one prompt and records every block's call (its input and the
arguments the model passes: masks, RoPE position embeddings, ...). :func:`block_jacobian` then re-runs only that
block as a function of one token's input, the other tokens fixed, with d forward-mode JVPs (``torch.func.jvp``
vmapped over the basis, in chunks if asked; all output tokens at once); a diagonal Jacobian ``J_{tt}`` runs the block
on token t alone with d vmapped VJPs (reverse mode) instead. Attention runs on PyTorch's math SDPA
kernel (``sdpa_kernel(SDPBackend.MATH)``, public): the fused kernels have no forward-mode AD. Dropout must be off:
the block runs in eval mode, and ``vmap``'s ``randomness="error"`` refuses any random op. Half/bf16 blocks are
copied to float32 for the Jacobian; float64 models stay float64. Each block is re-run on its own device, so models
sharded with ``device_map`` work.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from layerwise.errors import LayerwiseWarning
from layerwise.features.hooks import block_input, block_output, hooked_blocks
from layerwise.features.modes import eval_mode
from layerwise.features.paths import Blocks
from layerwise.features.token_rows import split_attention, split_block

JacobianMethod = Literal["auto", "full"]
_NO_CACHE = {"past_key_values": None, "past_key_value": None, "layer_past": None, "use_cache": False}


@dataclass
class BlockCall:
    """One block's call in a traced forward pass: its input ``(T, d)``, output ``(T, d)`` and other arguments."""

    inputs: Tensor
    outputs: Tensor
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass
class BlockTrace:
    """Every block's call for one prompt; ``trajectory`` is the residual stream ``x^0 .. x^L``, (L+1, T, d)."""

    calls: list[BlockCall]

    @property
    def trajectory(self) -> Tensor:
        first = self.calls[0].inputs
        return torch.stack([first] + [call.outputs.to(first.device) for call in self.calls])


def _is_cache(value: Any) -> bool:
    """A Hugging Face KV cache (``transformers.Cache``), which a re-run of the block would append to."""
    try:
        from transformers import Cache
    except ImportError:  # timm-only install
        return False
    return isinstance(value, Cache)


def _no_cache(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's keyword arguments with any KV cache removed (a re-run must not append to it)."""
    return {
        key: (_NO_CACHE[key] if key in _NO_CACHE else None if _is_cache(value) else value)
        for key, value in kwargs.items()
    }


class _AllBlocksTraced(Exception):
    """Raised after the last block's call: the final norm and the head (a vocabulary-sized matmul) are not needed."""


@torch.no_grad()
def trace_blocks(blocks: Blocks, run: Callable[[], Any]) -> BlockTrace:
    """Run ``run()`` (one forward pass on ONE prompt, batch size 1) and record every block's call.

    The forward pass stops once the last block has returned: what follows (the final norm, the head: for a language
    model a matmul with the whole vocabulary, often the largest of the pass) is never needed by a Jacobian, so
    ``run()``'s own result is not computed.

    Raises:
        ValueError: the batch has more than one prompt.
    """
    calls: dict[int, BlockCall] = {}
    returned: set[int] = set()

    def before(index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = block_input(args, kwargs)
        if hidden.shape[0] != 1:
            raise ValueError(f"Block Jacobians are taken one prompt at a time; got a batch of {hidden.shape[0]}.")
        rest = tuple(None if _is_cache(value) else value for value in args[1:])
        kwargs = {key: value for key, value in kwargs.items() if key != "hidden_states" or args}
        calls[index] = BlockCall(hidden[0].detach().clone(), hidden[0], rest, _no_cache(kwargs))

    def after(index: int, hidden: Tensor) -> None:
        calls[index].outputs = hidden[0].detach().clone()
        returned.add(index)
        if len(returned) == len(blocks):
            raise _AllBlocksTraced

    try:
        with hooked_blocks(blocks, on_output=after, on_call=before):
            run()
    except _AllBlocksTraced:
        pass
    if len(calls) != len(blocks):
        raise RuntimeError(f"Expected one call of each of the {len(blocks)} blocks, got {len(calls)}.")
    return BlockTrace([calls[index] for index in range(len(blocks))])


def jacobian_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other float dtype is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@contextmanager
def materialized(block: nn.Module) -> Iterator[nn.Module]:
    """The block itself, or for a block with weights that accelerate offloaded, a plain copy with them loaded.

    A model loaded with ``device_map`` and CPU/disk offloading keeps such weights on the meta device and loads them
    in hooks at each call, hooks that cannot run inside ``torch.func`` transforms. The block's offloaded submodules
    are loaded with accelerate's public ``align_module_device``, copied, and the copy's hooks removed
    (``remove_hook_from_module``): the Jacobian runs on one plain block of real weights, and the model is offloaded
    again on exit. Costs one block's weights in memory for the duration.
    """
    if not any(parameter.is_meta for parameter in block.parameters()):
        yield block
        return
    try:
        from accelerate.hooks import remove_hook_from_module
        from accelerate.utils import align_module_device, has_offloaded_params
    except ImportError:  # meta weights without accelerate's hooks: nothing can load them
        raise ValueError(
            f"{type(block).__name__} has weights on the meta device and no accelerate offload hooks to load them: "
            "load the model with a device_map (pip install accelerate) or without meta weights."
        ) from None
    with contextlib.ExitStack() as loaded:
        for module in block.modules():
            if has_offloaded_params(module):
                loaded.enter_context(align_module_device(module))
        if any(parameter.is_meta for parameter in block.parameters()):
            raise ValueError(f"{type(block).__name__} has meta weights that accelerate's hooks do not load.")
        plain = remove_hook_from_module(copy.deepcopy(block), recurse=True)
    yield plain


@contextmanager
def exact_block(block: nn.Module, dtype: torch.dtype) -> Iterator[nn.Module]:
    """The block in eval mode and ``dtype`` (a float32 copy of a half/bf16 block; the block itself otherwise)."""
    parameter = next(block.parameters(), None)
    work = block if parameter is None or parameter.dtype == dtype else copy.deepcopy(block).to(dtype)
    with eval_mode(work):
        yield work


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, Tensor) and value.is_floating_point():
        return value.to(dtype)
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(item, dtype) for item in value)
    return value


def block_jacobian(
    block: nn.Module,
    call: BlockCall,
    token: int,
    out_tokens: Optional[Sequence[int]] = None,
    dtype: Optional[torch.dtype] = None,
    chunk_size: Optional[int] = None,
    method: JacobianMethod = "auto",
) -> Tensor:
    """Jacobians ``J_{token -> t2}`` of the block's residual update for every output token t2 (or ``out_tokens``).

    Args:
        block: the block (from :func:`~layerwise.features.paths.get_blocks`).
        call: its call, from :func:`trace_blocks`.
        token: the input token t1 (negative counts from the end).
        out_tokens: the output tokens t2 (default all T).
        dtype: computation dtype (default: :func:`jacobian_dtype` of the block input).
        chunk_size: JVPs run at once (default all d): memory grows with it, d times one block's activations at
            most.
        method: ``"auto"``: when the only output token is ``token`` itself (``J_{tt}``), the block runs on that one
            token against the other tokens' fixed keys/values (:mod:`layerwise.features.token_rows`, about T times
            less work), falling back to the whole prompt with a warning where the block cannot be split so;
            ``"full"``: always the whole prompt (every output token at once).

    Returns:
        ``(len(out_tokens), d, d)``: ``[k, i, j] = d f(X)_{t2_k, i} / d x_{t1, j}``.
    """
    x0 = call.inputs
    dtype = dtype or jacobian_dtype(x0.dtype)
    num_tokens = x0.shape[0]
    token = range(num_tokens)[token]
    rows = torch.arange(num_tokens, device=x0.device) if out_tokens is None else torch.as_tensor(out_tokens)
    rows = rows.to(x0.device)
    if method not in ("auto", "full"):
        raise ValueError(f"`method={method!r}` must be 'auto' or 'full'.")
    if method == "auto" and rows.tolist() == [token]:
        return diagonal_block_jacobian(block, call, token, dtype, chunk_size).unsqueeze(0)
    with materialized(block) as loaded, exact_block(loaded, dtype) as work:
        device = next(work.parameters(), x0).device
        base = x0.to(device=device, dtype=dtype)
        rows = rows.to(device)
        args, kwargs = _cast(call.args, dtype), {key: _cast(value, dtype) for key, value in call.kwargs.items()}
        _quiet_first_jvp()
        one_hot = torch.zeros(num_tokens, 1, dtype=dtype, device=device)
        one_hot[token] = 1.0

        def update(x: Tensor) -> Tensor:
            hidden = base + one_hot * (x - base[token])
            return (block_output(work(hidden.unsqueeze(0), *args, **kwargs))[0] - hidden)[rows]

        try:
            # no_grad: forward-mode AD needs no backward graph; without it every chunk's graph (the parameters
            # require grad) would stay alive until the end, several times the memory of the tangents themselves.
            with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
                basis = torch.eye(base.shape[1], dtype=dtype, device=device)

                def column(tangent: Tensor) -> Tensor:
                    return torch.func.jvp(update, (base[token],), (tangent,))[1]

                columns = torch.func.vmap(column, chunk_size=chunk_size, randomness="error")(basis)  # (d_in, T, d)
                return columns.permute(1, 2, 0).detach()
        except RuntimeError as error:
            _explain(block, error)
            raise


@functools.cache
def _quiet_first_jvp() -> None:
    """Run the process's first forward-mode AD here, where its one upstream warning is silenced.

    On its first JVP, torch builds its JVP decompositions with its own ``torch.jit.script``, which warns that
    ``torch.jit.script`` is deprecated (torch >= 2.9): a warning about torch's internals, not about this code.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning)
        torch.func.jvp(torch.sin, (torch.zeros(1),), (torch.ones(1),))


def _explain(block: nn.Module, error: RuntimeError) -> None:
    if "forward AD" in str(error) or "forward-mode" in str(error):
        raise RuntimeError(
            f"{type(block).__name__} uses an attention kernel without forward-mode AD ({error}). Load the "
            "model with attn_implementation='eager' or 'sdpa'."
        ) from None


def diagonal_block_jacobian(
    block: nn.Module,
    call: BlockCall,
    token: int,
    dtype: Optional[torch.dtype] = None,
    chunk_size: Optional[int] = None,
) -> Tensor:
    """``J_{token -> token}`` (d, d) of one block, from the block run on that one token (the row it needs).

    The other tokens' keys/values come from one run of the block on the whole prompt and are constants
    (:func:`~layerwise.features.token_rows.split_block`); d vmapped VJPs (one per output coordinate, reverse mode)
    then run through the block on one token instead of T. Where the
    block cannot be split so (its one-token row differs from the whole prompt's row, or it does not run on one
    token), a one-line warning says why and :func:`block_jacobian` with ``method="full"`` answers.
    """
    x0 = call.inputs
    dtype = dtype or jacobian_dtype(x0.dtype)
    token = range(x0.shape[0])[token]
    with materialized(block) as loaded, exact_block(loaded, dtype) as work:
        device = next(work.parameters(), x0).device
        base = x0.to(device=device, dtype=dtype)
        args, kwargs = _cast(call.args, dtype), {key: _cast(value, dtype) for key, value in call.kwargs.items()}
        # The trace already ran the block on the whole prompt: its row at the token spares the split that run.
        row = (call.outputs[token] - x0[token]).to(device) if x0.dtype == dtype else None
        _quiet_first_jvp()
        split = split_block(work, base, args, kwargs, token, row)
        if isinstance(split, str):
            warnings.warn(
                f"{type(block).__name__}: Jacobian on the whole prompt, not on token {token} alone: {split}.",
                LayerwiseWarning,
                stacklevel=2,
            )
        else:
            try:
                with split_attention(work, split), torch.no_grad():
                    # d -> d: reverse mode, one VJP per output coordinate, takes as many passes as forward mode but
                    # runs autograd's C++ backward formulas, where forward mode runs some ops' Python
                    # decompositions (layer norm, GELU): about 1.5x faster per block on a CPU thread. The pullback
                    # comes from the split's own check of the one-token row.
                    basis = torch.eye(base.shape[1], dtype=dtype, device=device)
                    (rows,) = torch.func.vmap(split.pullback, chunk_size=chunk_size, randomness="error")(basis)
                    return rows.detach()
            except RuntimeError as error:
                _explain(block, error)
                raise
    return block_jacobian(block, call, token, [token], dtype, chunk_size, method="full")[0]


def diagonal_jacobians(
    blocks: Blocks,
    trace: BlockTrace,
    token: int = -1,
    dtype: Optional[torch.dtype] = None,
    chunk_size: Optional[int] = None,
    method: JacobianMethod = "auto",
) -> Tensor:
    """``J^l_{tt}`` of every block at one token: ``(L, d, d)`` on the device of the first block's input.

    ``method`` as for :func:`block_jacobian`: ``"auto"`` runs each block on the one token
    (:func:`diagonal_block_jacobian`), ``"full"`` on the whole prompt.
    """
    out = [
        block_jacobian(block, call, token, [range(call.inputs.shape[0])[token]], dtype, chunk_size, method)[0]
        for block, call in zip(blocks, trace.calls)
    ]
    return torch.stack([jacobian.to(trace.calls[0].inputs.device) for jacobian in out])
