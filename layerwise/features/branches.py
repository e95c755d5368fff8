"""The residual branches inside the blocks: the norms of the skip x and of the branch F(x) at one token per sample.

Layer access for App. B.2 of Jiang et al.: a block adds long branches to the residual stream, x -> x + F(x), once
for attention and once for the MLP (``Branch`` paths in the family table, :mod:`layerwise.features.paths`). The
ratio ||x|| / ||F(x)|| says how much of the stream the branch rewrites. :class:`BranchNorms` hooks every block and
both branches for the forward passes run while it is attached, and keeps only two float64 norms per sample, block
and branch — never a hidden state.

``block`` is the whole block: x its input, F(x) = block(x) - x its update (for a pre-LN block the sum of its
branches; for a post-LN block such as BERT's, the update after its LayerNorms).
"""

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Optional, Union

import torch
from torch import Tensor, nn

from layerwise.features.hooks import hooked_blocks
from layerwise.features.paths import Blocks, Branch, LayerPaths, get_part

BLOCK = "block"


def _at_token(hidden: Tensor, token: Union[int, Tensor]) -> Tensor:
    """The (B, d) float64 rows of (B, T, d) ``hidden`` at ``token``: one position (B,) per sample, or one int."""
    if isinstance(token, int):
        return hidden[:, token].to(torch.float64)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), token.to(hidden.device)].to(torch.float64)


def default_token(paths: LayerPaths) -> str:
    """``"cls"`` for a model with a [CLS] token (BERT-like encoders, timm ViTs with a class token), else ``"last"``."""
    return "cls" if paths.num_prefix_tokens > 0 else "last"


def token_positions(attention_mask: Optional[Tensor], token: str) -> Union[int, Tensor]:
    """Where each sample's ratio is read: ``"cls"`` -> 0; ``"last"`` -> each sample's last real token.

    The last real token is the last position whose ``attention_mask`` is 1 (left or right padding alike), or the
    last position when there is no mask.
    """
    if token == "cls":
        return 0
    if attention_mask is None:
        return -1
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (attention_mask.bool() * (positions + 1)).argmax(dim=1)


class BranchNorms:
    """Hooks that record ||x|| and ||F(x)|| at one token per sample, for every block and branch.

    Args:
        blocks: the block list.
        branches: name -> :class:`Branch` (from the family table, ``LayerPaths.branches``).
        option: the option named in the error when a branch module is missing.

    Use: set ``token`` (:func:`token_positions`: each sample's [CLS] or last real token) before each forward pass
    inside ``attached()``; ``pop()`` then returns ``(skip, branch)`` norms, each (P, L, B) float64 for the P names
    ``names`` (``block`` first) and L blocks.
    """

    def __init__(self, blocks: Blocks, branches: Mapping[str, Branch], option: str = "branches") -> None:
        if not branches:
            raise ValueError(
                f"`{option}`: the family table gives no residual branches for this model; add `branches` to its "
                "entry in layerwise/features/paths.py."
            )
        self.blocks = list(blocks)
        self.names = (BLOCK, *branches)
        self.modules: list[dict[str, tuple[nn.Module, nn.Module, int]]] = []
        for index, block in enumerate(self.blocks):
            parts = {}
            for name, branch in branches.items():
                skip = get_part(block, branch.skip, f"{option} (block {index}, {name}.skip)")
                out = get_part(block, branch.out, f"{option} (block {index}, {name}.out)")
                parts[name] = (skip, out, branch.skip_arg)
            self.modules.append(parts)
        self.skip_args = {name: branch.skip_arg for name, branch in branches.items()}
        self.token: Union[int, Tensor, None] = None
        self._norms: dict[tuple[str, int, str], Tensor] = {}
        self._block_inputs: dict[int, Tensor] = {}

    def _record(self, key: tuple[str, int, str], hidden: Tensor) -> None:
        if self.token is None:
            raise RuntimeError("BranchNorms.token must be set before the forward pass.")
        self._norms[key] = torch.linalg.vector_norm(_at_token(hidden, self.token), dim=-1)

    @contextmanager
    def attached(self) -> Iterator["BranchNorms"]:
        """Hook the blocks and branches through ``hooked_blocks``; the hooks are removed on exit, whatever happens."""

        def on_block_input(index: int, hidden: Tensor) -> None:
            self._block_inputs[index] = _at_token(hidden, self.token)
            self._norms[(BLOCK, index, "skip")] = torch.linalg.vector_norm(self._block_inputs[index], dim=-1)

        def on_block_output(index: int, hidden: Tensor) -> None:
            update = _at_token(hidden, self.token) - self._block_inputs.pop(index)
            self._norms[(BLOCK, index, "branch")] = torch.linalg.vector_norm(update, dim=-1)

        try:
            with ExitStack() as hooks:
                hooks.enter_context(hooked_blocks(self.blocks, on_output=on_block_output, on_input=on_block_input))
                for name, skip_arg in self.skip_args.items():
                    skips = [parts[name][0] for parts in self.modules]
                    outs = [parts[name][1] for parts in self.modules]
                    record_skip = partial(self._record_at, name, "skip")
                    record_branch = partial(self._record_at, name, "branch")
                    hooks.enter_context(hooked_blocks(skips, on_input=record_skip, input_arg=skip_arg))
                    hooks.enter_context(hooked_blocks(outs, on_output=record_branch))
                yield self
        finally:
            self._block_inputs.clear()

    def _record_at(self, name: str, part: str, index: int, hidden: Tensor) -> None:
        self._record((name, index, part), hidden)

    def pop(self) -> tuple[Tensor, Tensor]:
        """The norms of the last forward pass: skip and branch, each (P, L, B) float64; cleared afterwards."""
        missing = [
            f"{name}[{index}]"
            for name in self.names
            for index in range(len(self.blocks))
            if (name, index, "skip") not in self._norms or (name, index, "branch") not in self._norms
        ]
        if missing:
            raise RuntimeError(f"BranchNorms: no norms recorded for {missing[:4]} (was the forward pass run?).")
        stacked = [
            torch.stack(
                [torch.stack([self._norms[(name, i, part)] for i in range(len(self.blocks))]) for name in self.names]
            )
            for part in ("skip", "branch")
        ]
        self._norms.clear()
        return stacked[0], stacked[1]
