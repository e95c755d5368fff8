"""The one way layerwise hooks blocks: context managers that always remove their hooks.

- :func:`hooked_blocks` calls ``on_input(index, hidden)`` / ``on_output(index, hidden)`` for every block call.
- :func:`collect_block_outputs` runs a forward pass and returns every block's output in block order.
- :func:`capture_block_call` runs a forward pass up to the entry of one block and returns what it was called with.
- :class:`HookTap` pools every block's output of a model the callbacks know nothing about.
"""

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from layerwise.errors import UsageError
from layerwise.features.paths import Blocks, HeadSteps, LayerPaths, find_layer_paths, get_blocks
from layerwise.features.pooling import check_pooling, pool_tokens

BlockCallback = Callable[[int, Tensor], None]


def block_output(output: Any) -> Tensor:
    """The hidden states a block returns (a tensor, or the first element of a tuple in older transformers)."""
    return output[0] if isinstance(output, (tuple, list)) else output


def block_input(args: tuple[Any, ...], kwargs: dict[str, Any], position: int = 0) -> Tensor:
    """The hidden states a block is called with: its ``position``-th argument, else its ``hidden_states`` keyword."""
    return args[position] if len(args) > position else kwargs["hidden_states"]


@contextmanager
def hooked_blocks(
    blocks: Blocks,
    on_output: Optional[BlockCallback] = None,
    on_input: Optional[BlockCallback] = None,
    indices: Optional[Sequence[int]] = None,
    input_arg: int = 0,
    on_call: Optional[Callable[[int, tuple[Any, ...], dict[str, Any]], None]] = None,
) -> Iterator[None]:
    """Call ``on_input``/``on_output`` with ``(block index, hidden states (B, T, d))`` at every call of the blocks.

    Args:
        blocks: the block list (from :func:`~layerwise.features.paths.get_blocks`), or any list of modules called
            once per forward pass (a branch's norm or output projection in every block, say).
        on_output: called with each block's output (the residual stream after the block).
        on_input: called with each block's input (the residual stream before it).
        indices: 0-based blocks to hook (default all).
        input_arg: the position of the hidden states among the modules' arguments (``hidden_states=`` if absent).
        on_call: called with ``(block index, args, kwargs)`` of every call, before the block runs (all of its
            inputs: masks, position embeddings, caches).

    The hooks are removed on exit, whatever happens in the body.
    """
    handles = []
    try:
        for index in range(len(blocks)) if indices is None else indices:
            block = blocks[index]
            if on_input is not None:
                handles.append(
                    block.register_forward_pre_hook(
                        lambda module, args, kwargs, i=index: on_input(i, block_input(args, kwargs, input_arg)),
                        with_kwargs=True,
                    )
                )
            if on_call is not None:
                handles.append(
                    block.register_forward_pre_hook(
                        lambda module, args, kwargs, i=index: on_call(i, args, kwargs), with_kwargs=True
                    )
                )
            if on_output is not None:
                handles.append(
                    block.register_forward_hook(
                        lambda module, args, output, i=index: on_output(i, block_output(output))
                    )
                )
        yield
    finally:
        for handle in handles:
            handle.remove()


def collect_block_outputs(blocks: Blocks, run: Callable[[], Any]) -> list[Tensor]:
    """Call ``run()`` (one forward pass) and return every block's output, in block order, gradients kept."""
    outputs: list[Tensor] = []
    with hooked_blocks(blocks, on_output=lambda index, hidden: outputs.append(hidden)):
        run()
    if len(outputs) != len(blocks):
        raise RuntimeError(f"Expected one output from each of the {len(blocks)} blocks, got {len(outputs)}.")
    return outputs


class _ReachedBlock(Exception):
    """Raised by :func:`capture_block_call`'s pre-hook to stop the forward pass at the entry of a block."""


def capture_block_call(block: nn.Module, run: Callable[[], Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Run ``run()`` up to the entry of ``block`` and return the ``(args, kwargs)`` the model calls it with.

    The model's own forward computes everything before the block (embeddings, position encodings, attention-mask
    construction for the configured attention implementation) and is stopped there, so nothing of it is
    re-implemented.
    """
    captured: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def stop(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        captured.append((args, dict(kwargs)))
        raise _ReachedBlock

    handle = block.register_forward_pre_hook(stop, with_kwargs=True, prepend=True)  # before any other hook
    try:
        run()
    except _ReachedBlock:
        pass
    finally:
        handle.remove()
    if not captured:
        raise RuntimeError(f"The forward pass never called the block {type(block).__name__}.")
    return captured[0]


def _as_steps(value: Union[str, Sequence[str], None]) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def hook_paths(
    root: nn.Module,
    blocks: Optional[str] = None,
    final_norm: Union[str, Sequence[str], None] = None,
    classifier: Union[str, Sequence[str], None] = None,
    pooling: Optional[str] = None,
    num_prefix_tokens: Optional[int] = None,
) -> LayerPaths:
    """Paths relative to ``root``: the given ones (``blocks`` and ``classifier`` together), else the table's."""
    if blocks is None and classifier is None:
        found = find_layer_paths(root)
    elif blocks is None or classifier is None:
        raise UsageError("Give both `blocks` and `classifier` (and `final_norm` if the model has one), or neither.")
    else:
        found = LayerPaths(blocks, head=_as_steps(classifier), final_norm=_as_steps(final_norm))
    if found.pooling == "tokens" and pooling is None:
        raise UsageError(
            f"The {found.family} model in {type(root).__name__} predicts at every token: give `pooling` "
            "('cls', 'mean' or 'last') for the callbacks' per-sample features."
        )
    prefix_tokens = found.num_prefix_tokens if num_prefix_tokens is None else num_prefix_tokens
    return replace(found, pooling=pooling or found.pooling, num_prefix_tokens=prefix_tokens)


class HookTap:
    """Collect every block's pooled output with forward hooks during the model's own forward pass.

    Args:
        root: the module the paths are relative to (usually the LightningModule).
        paths: where the blocks, final norm and classifier are (see :func:`hook_paths`).

    Use ``with tap.attached(): ...`` around the forward passes; the hooks are always removed on exit. After each
    forward pass, :meth:`pop` returns the ``features`` ``(L, B, d)``; the callbacks read them through :meth:`head` with
    the one readout (:func:`~layerwise.engines.readout.read_layers`).
    """

    def __init__(self, root: nn.Module, paths: LayerPaths) -> None:
        check_pooling(paths.pooling)
        self.paths = paths
        self.blocks = get_blocks(root, paths)
        self.head_steps = HeadSteps(root, paths.shared_head)
        self.head_modules = self.head_steps.modules()
        self.attention_mask: Optional[Tensor] = None
        self._pooled: list[Tensor] = []

    @property
    def num_layers(self) -> int:
        """Number of blocks ``L``."""
        return len(self.blocks)

    @contextmanager
    def attached(self) -> Iterator["HookTap"]:
        """Register one forward hook per block; removed on exit, whatever happens."""
        try:
            with hooked_blocks(self.blocks, on_output=self._hook):
                yield self
        finally:
            self._pooled.clear()

    def _hook(self, index: int, tokens: Tensor) -> None:
        pooled = pool_tokens(tokens, self.paths.pooling, self.paths.num_prefix_tokens, self.attention_mask)
        self._pooled.append(pooled.detach())

    def head(self, h: Tensor) -> Tensor:
        """The model's own final norm + classifier applied to features of any leading shape."""
        return self.head_steps(h)

    @torch.no_grad()
    def pop(self) -> Tensor:
        """The features ``(L, B, d)`` of the last forward pass; clears the collected outputs."""
        pooled, self._pooled = self._pooled, []
        if len(pooled) != self.num_layers:
            raise RuntimeError(
                f"Expected one output from each of the {self.num_layers} blocks in one evaluation step, got "
                f"{len(pooled)}: the step must run the model exactly once per batch."
            )
        check_equal_widths(pooled, self.paths.blocks)
        return torch.stack(pooled)


def check_equal_widths(pooled: Sequence[Tensor], blocks: Optional[str]) -> None:
    """Raise a UsageError naming ``blocks`` unless every block's pooled output ``(B, ...)`` has the same width.

    The per-layer metrics compare every layer with every other on one feature space (and the shared head reads one
    width), so blocks of a hierarchical model's different stages cannot be stacked.
    """
    shapes = [tuple(tensor.shape[1:]) for tensor in pooled]
    first = next((i for i, shape in enumerate(shapes) if shape != shapes[0]), None)
    if first is None:
        return

    def width(shape: tuple[int, ...]) -> str:
        return str(shape[0]) if len(shape) == 1 else str(shape)

    raise UsageError(
        f"`blocks={blocks}`: the hooked blocks return features of different widths: block 1 returns features of "
        f"width {width(shapes[0])}, block {first + 1} of width {width(shapes[first])}; every layer must have one "
        "width (the metrics compare layers, the shared head reads them): give `blocks` a list of blocks of one width."
    )


class _Stop(Exception):
    """Raised by :func:`residual_after`'s hook to stop the forward pass once the wanted residual is taken."""


def residual_after(blocks: Blocks, layer: int, run: Callable[[], Any]) -> Tensor:
    """The residual stream after block ``layer`` (1-based; 0 = the input of block 1, the embeddings) of ``run()``.

    The model's own forward runs up to that point and stops there: no later block or head runs.
    """
    if not 0 <= layer <= len(blocks):
        raise ValueError(f"`layer={layer}` must lie in 0..{len(blocks)}.")
    if layer == 0:
        args, kwargs = capture_block_call(blocks[0], run)
        return block_input(args, kwargs)
    taken: list[Tensor] = []

    def take(module: nn.Module, args: Any, output: Any) -> None:
        taken.append(block_output(output))
        raise _Stop

    handle = blocks[layer - 1].register_forward_hook(take)
    try:
        run()
    except _Stop:
        pass
    finally:
        handle.remove()
    if not taken:
        raise RuntimeError(f"The forward pass never reached block {layer}.")
    return taken[0]


@contextmanager
def replaced_block_input(blocks: Blocks, index: int, hidden: Tensor) -> Iterator[None]:
    """Within the body, block ``index`` (0-based) is called with ``hidden`` instead of its input; removed on exit.

    The model's own forward still computes everything else (masks, positions, RoPE) from its inputs.
    """

    def replace(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        if args:
            return (hidden, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": hidden}

    handle = blocks[index].register_forward_pre_hook(replace, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
