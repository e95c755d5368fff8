"""Block coupling of one model over prompts: what the ``BlockCoupling`` callback and ``layerwise coupling`` share.

:class:`CouplingAnalysis`: for each prompt it traces the blocks once, takes the exact Jacobians ``J^l_{tt}`` at the
chosen token (:mod:`layerwise.features.jacobian`) and feeds float64 sum-state metrics
(:mod:`layerwise.metrics.dynamics`), so the result is a mean over prompts that is identical on 1 or n DDP processes.
Torch is imported inside the functions: the command's module imports this one at its top, and its ``--help`` imports
no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

if TYPE_CHECKING:
    from torch import Tensor, nn

    from layerwise.features.jacobian import BlockTrace
    from layerwise.features.paths import Blocks

Token = Union[Literal["last", "first"], int]
# layerwise.metrics.functional_dynamics's own (a test keeps them equal), here so that `coupling --help` needs no torch
CouplingForm = Literal["code", "offdiag"]
SvdMethod = Literal["full", "randomized"]
TokenMode = Literal["self", "fixed_input", "fixed_output"]
_TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def token_coupling(
    blocks: Blocks,
    trace: BlockTrace,
    first: int,
    second: int,
    mode: TokenMode = "self",
    k: int = 10,
    form: CouplingForm = "code",
    chunk_size: Optional[int] = None,
) -> Tensor:
    """Token-wise mis-coupling T x T of blocks ``first`` (l) and ``second`` (l') on one traced prompt.

    - ``self``: ``M[t, t'] = m_K(J^l_{tt}, J^{l'}_{t't'})``, every token's own Jacobian;
    - ``fixed_input``: the input token is t1 = 0, ``M[t2, t2'] = m_K(J^l_{0->t2}, J^{l'}_{0->t2'})`` (token 0
      reaches every output, also in a causal model);
    - ``fixed_output``: the output token is t2 = T-1, ``M[t1, t1'] = m_K(J^l_{t1->T-1}, J^{l'}_{t1'->T-1})``
      (the last token sees every input).

    The basis is always that of the column's Jacobian (block l'). An entry whose Jacobian is zero (no path from
    input to output) is NaN.
    """
    import torch

    from layerwise.features.jacobian import block_jacobian
    from layerwise.metrics.functional_dynamics import pairwise_mis_coupling

    num_tokens = trace.calls[first].inputs.shape[0]

    def stack(index: int) -> Tensor:
        block, call = blocks[index], trace.calls[index]
        if mode == "fixed_input":
            return block_jacobian(block, call, 0, chunk_size=chunk_size)
        last = [num_tokens - 1] if mode == "fixed_output" else None
        return torch.stack(
            [
                block_jacobian(block, call, t, out_tokens=last or [t], chunk_size=chunk_size)[0]
                for t in range(num_tokens)
            ]
        )

    if mode not in ("self", "fixed_input", "fixed_output"):
        raise ValueError(f"`mode={mode!r}` must be 'self', 'fixed_input' or 'fixed_output'.")
    a, b = stack(first), stack(second).to(trace.calls[first].inputs.device)
    return pairwise_mis_coupling(a.to(b.device), b, ks=(k,), form=form)[0]


def one_prompt(batch: Any) -> tuple[dict[str, Tensor], tuple[Tensor, ...]]:
    """The model's keyword/positional inputs for the first sample of ``batch``, padding removed.

    Text batches are dicts (``input_ids``, ``attention_mask``, ``token_type_ids``); image batches are ``(x, y)``
    or a tensor.
    """
    if isinstance(batch, Mapping):
        inputs = {key: batch[key][:1] for key in _TEXT_KEYS if key in batch}
        if "input_ids" not in inputs:
            raise ValueError(f"A text batch needs `input_ids`; got keys {sorted(batch)}.")
        mask = inputs.get("attention_mask")
        if mask is not None:
            keep = mask[0].bool()
            inputs = {key: value[:, keep] for key, value in inputs.items()}
        return inputs, ()
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    return {}, (x[:1],)


def resolve_token(token: Token, num_tokens: int) -> int:
    """0-based index of ``token`` ("last", "first" or an int, negatives from the end) among ``num_tokens``."""
    if token == "last":
        return num_tokens - 1
    if token == "first":
        return 0
    if isinstance(token, bool) or not isinstance(token, int) or not -num_tokens <= token < num_tokens:
        raise ValueError(f"`tokens={token!r}` must be 'last', 'first' or an index in [-{num_tokens}, {num_tokens}).")
    return range(num_tokens)[token]


class CouplingAnalysis:
    """Per-prompt block analysis of one model, accumulated over prompts.

    Args:
        model: a model of a known family (timm ViT, Hugging Face BERT/GPT-2/NeoX/LLaMA/...), or a module holding one.
        ks: numbers K of top singular vectors for the depth-wise coupling.
        tokens: the token whose Jacobians are taken: ``"last"`` (default; the last real token), ``"first"`` or an
            index.
        form: mis-coupling form, ``"code"`` or ``"offdiag"``.
        method: ``"full"`` SVD or ``"randomized"`` (checked; falls back with a warning).
        token_pair_blocks: also keep, for the first prompt, the token-wise (self) coupling T x T of these two
            0-based blocks (the command's figure), or None.
        chunk_size: JVPs run at once per block (default all d; lower it to bound the memory of wide models).
        token_mode: the token-wise coupling kept for the first prompt (see :func:`token_coupling`).
    """

    def __init__(
        self,
        model: nn.Module,
        ks: Sequence[int] = (10, 30, 50),
        tokens: Token = "last",
        form: CouplingForm = "code",
        method: SvdMethod = "full",
        token_pair_blocks: Optional[tuple[int, int]] = None,
        chunk_size: Optional[int] = None,
        token_mode: TokenMode = "self",
    ) -> None:
        from layerwise.features.paths import find_model, get_blocks, layer_paths
        from layerwise.metrics import DepthCoupling, JacobianSpectrum, LinearisationCosine, TrajectoryShape

        self.model = find_model(model)
        self.chunk_size = chunk_size
        if token_mode not in ("self", "fixed_input", "fixed_output"):
            raise ValueError(f"`token_mode={token_mode!r}` must be 'self', 'fixed_input' or 'fixed_output'.")
        self.token_mode = token_mode
        self.paths = layer_paths(self.model)
        self.blocks = get_blocks(self.model, self.paths)
        self.num_layers = len(self.blocks)
        self.ks, self.tokens, self.form, self.method = tuple(ks), tokens, form, method
        self.token_pair_blocks = token_pair_blocks
        self.depth = DepthCoupling(self.num_layers, self.ks, form, method, sync_on_compute=False)
        self.spectrum = JacobianSpectrum(self.num_layers, sync_on_compute=False)
        self.linearisation = LinearisationCosine(sync_on_compute=False)
        self.trajectory = TrajectoryShape(self.num_layers, sync_on_compute=False)
        self.token_coupling: Optional[Tensor] = None
        self.example_trajectory: Optional[Tensor] = None

    @property
    def metrics(self) -> list:
        return [self.depth, self.spectrum, self.linearisation, self.trajectory]

    def check_width(self, width: int) -> None:
        """Refuse K larger than the model width before any work."""
        if max(self.ks) > width:
            raise ValueError(f"`ks={list(self.ks)}`: every K must be at most the model width d={width}.")

    def trace(self, batch: Any) -> BlockTrace:
        """Run the model on the first prompt of ``batch`` and record every block's call."""
        from layerwise.features.hf import input_device, no_cache
        from layerwise.features.jacobian import trace_blocks

        kwargs, args = one_prompt(batch)
        device = input_device(self.model)
        kwargs = {key: value.to(device) for key, value in kwargs.items()}
        args = tuple(value.to(device=device, dtype=next(self.model.parameters()).dtype) for value in args)
        extra = no_cache(self.model) if kwargs else {}
        return trace_blocks(self.blocks, lambda: self.model(*args, **kwargs, **extra))

    def add(self, batch: Any, counted: bool = True) -> None:
        """Analyse the first prompt of ``batch`` (gradients on, eval mode, outside any inference mode).

        ``counted=False`` makes the same block calls and counts nothing: a rank with fewer prompts than another
        pads with it, so that every rank calls every (possibly sharded, FSDP2) block as often as the others.
        """
        import torch

        from layerwise.features.jacobian import diagonal_jacobians
        from layerwise.features.modes import eval_mode

        with torch.inference_mode(False), torch.enable_grad(), eval_mode(self.model):
            trace = self.trace(batch)
            num_tokens = trace.calls[0].inputs.shape[0]
            self.check_width(trace.calls[0].inputs.shape[-1])
            token = resolve_token(self.tokens, num_tokens)
            jacobians = diagonal_jacobians(self.blocks, trace, token, chunk_size=self.chunk_size)
            trajectory = trace.trajectory
            first = self.example_trajectory is None
            token_coupling = self._token_coupling(trace) if first and self.token_pair_blocks is not None else None
            if not counted:
                return
            self.depth.update(jacobians)
            self.spectrum.update(jacobians)
            self.linearisation.update(jacobians, trajectory[0, token], trajectory[-1, token])
            self.trajectory.update(trajectory)
            if first:
                self.example_trajectory = trajectory.detach().cpu()
                self.token_coupling = token_coupling

    def _token_coupling(self, trace: BlockTrace) -> Tensor:
        """Token-wise coupling of the two chosen blocks on this prompt, for the smallest K."""
        assert self.token_pair_blocks is not None
        first, second = self.token_pair_blocks
        return token_coupling(
            self.blocks, trace, first, second, self.token_mode, min(self.ks), self.form, self.chunk_size
        ).cpu()

    def to(self, device: Any) -> CouplingAnalysis:
        """Move the metrics' states (e.g. to the GPU before an NCCL reduction)."""
        for metric in self.metrics:
            metric.to(device)
        return self

    def reduce(self, process_group: Optional[Any] = None) -> None:
        """Sum the states over DDP processes (collective; a no-op on one process)."""
        from layerwise.metrics.sync import all_reduce_sum_states

        all_reduce_sum_states(self.metrics, process_group)

    def results(self) -> dict[str, Any]:
        """Everything, as float64 tensors/lists (JSON-ready through ``layerwise.results.to_json``)."""
        spectrum = self.spectrum.compute()
        return {
            "num_prompts": int(self.depth.count),
            "token": self.tokens,
            "ks": list(self.ks),
            "form": self.form,
            "depth_coupling": self.depth.compute(),
            "coupling_score": self.depth.score(),
            "sigma": spectrum["sigma"],
            "inverse_sigma_1": spectrum["inverse_sigma_1"],
            "linearisation_cosine": self.linearisation.compute(),
            **{f"trajectory_{key}": value for key, value in self.trajectory.compute().items()},
        }

    def reset(self) -> None:
        for metric in self.metrics:
            metric.reset()
        self.token_coupling = None
        self.example_trajectory = None
