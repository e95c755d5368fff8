"""The one readout: the head applied to every layer in token chunks, and the hand-off it builds, ``LayerOutputs``.

For a classifier with ten classes the head's logits of every layer are tiny; for a language model with a 50,257-token
vocabulary one layer's logits over 8,192 tokens are already 1.6 GB in float32. Every function here walks the
``(rows, d)`` features in chunks of ``chunk_size`` rows: the peak extra memory is about one chunk of logits
(``chunk_size x V``), whatever the number of layers and tokens. The training losses (``chunked_cross_entropy``,
``chunked_kl_divergence``) keep the gradient; everything else reads a layer through ``chunked_readout`` — the modules'
evaluation steps and the callbacks' hooks via ``read_layers``, which builds :class:`LayerOutputs`, and the probes,
early exit and ``lens`` (``tests/project/test_architecture.py`` finds any other call of a head on a layer).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from layerwise.features.backbone import IGNORE_INDEX
from layerwise.metrics.functional import Readout, readout_rows, reference_rows

Head = Callable[[Tensor], Tensor]
DEFAULT_CHUNK_SIZE = 1024


def _at_least_float32(x: Tensor) -> Tensor:
    """Half-precision logits are upcast for the softmax; float32 and float64 stay as they are."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _cross_entropy_sum(head: Head, features: Tensor, targets: Tensor, label_smoothing: float) -> Tensor:
    logits = head(features)
    return F.cross_entropy(
        _at_least_float32(logits), targets, label_smoothing=label_smoothing, reduction="sum", ignore_index=IGNORE_INDEX
    )


def chunked_cross_entropy(
    head: Head,
    features: Tensor,
    targets: Tensor,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    label_smoothing: float = 0.0,
    recompute: bool = True,
) -> Tensor:
    """Mean cross-entropy of ``head(features)`` against ``targets``, one chunk of rows at a time.

    With ``recompute`` (default), every chunk runs under activation checkpointing: its logits are freed after the
    forward pass and recomputed, one chunk at a time, in the backward pass — also when all rows fit in one chunk,
    since a loss over several layers would otherwise keep every layer's logits until the backward pass. So the extra
    peak memory of the loss, forward and backward, is about three ``(chunk_size, V)`` float32 tensors (logits,
    softmax, gradient) whatever the number of layers. ``recompute=False`` with at most ``chunk_size`` rows is the
    plain cross-entropy (for classifiers, whose logits are small: no recomputation cost).

    Args:
        head: the classifier (e.g. final norm + LM head), applied to features ``(n, d)``.
        features: ``(N, d)`` one layer's features.
        targets: ``(N,)`` class indices; rows with ``-100`` are ignored (the mean is over the other rows).
        chunk_size: rows per chunk.
        label_smoothing: as in ``torch.nn.functional.cross_entropy``.
        recompute: checkpoint the head even when the rows fit in one chunk.
    """
    rows = features.shape[0]
    counted = (targets != IGNORE_INDEX).sum().clamp_min(1)  # a tensor: no host synchronisation
    if rows <= chunk_size and not recompute:
        return _cross_entropy_sum(head, features, targets, label_smoothing) / counted
    total = features.new_zeros((), dtype=torch.promote_types(features.dtype, torch.float32))
    for start in range(0, rows, chunk_size):
        part = slice(start, start + chunk_size)
        total = total + checkpoint(
            _cross_entropy_sum, head, features[part], targets[part], label_smoothing, use_reentrant=False
        )
    return total / counted


def _kl_sum(student: Head, teacher: Head, low: Tensor, high: Tensor, temperature: float) -> Tensor:
    target = F.log_softmax(_at_least_float32(teacher(high).detach()) / temperature, dim=-1)
    prediction = F.log_softmax(_at_least_float32(student(low)) / temperature, dim=-1)
    return F.kl_div(prediction, target, log_target=True, reduction="sum")


def chunked_kl_divergence(
    student: Head,
    teacher: Head,
    student_features: Tensor,
    teacher_features: Tensor,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    recompute: bool = True,
) -> Tensor:
    """Mean over rows of ``KL(softmax(teacher(h')/T) || softmax(student(h)/T))``, teacher detached, in chunks.

    ``recompute`` as in :func:`chunked_cross_entropy`.
    """
    rows = student_features.shape[0]
    if rows <= chunk_size and not recompute:
        return _kl_sum(student, teacher, student_features, teacher_features, temperature) / max(rows, 1)
    total = student_features.new_zeros((), dtype=torch.promote_types(student_features.dtype, torch.float32))
    for start in range(0, rows, chunk_size):
        part = slice(start, start + chunk_size)
        total = total + checkpoint(
            _kl_sum,
            student,
            teacher,
            student_features[part],
            teacher_features[part],
            temperature,
            use_reentrant=False,
        )
    return total / rows


def _entropy(logits: Tensor) -> Tensor:
    """Softmax entropy (nats) of logits (..., C), in float64: ``Σ_c p_c (log Z - z_c)``."""
    z = logits.to(torch.float64)
    log_partition = torch.logsumexp(z, dim=-1, keepdim=True)
    return (log_partition - z).mul(torch.exp(z - log_partition)).sum(dim=-1)


def _read(head: Head, rows: Tensor, targets: Optional[Tensor], regroup: Optional[Head], entropy: bool) -> list:
    """The readout fields of one chunk of rows ``(n, d)``: the only place a head reads intermediate features."""
    logits = _logits(head, rows, regroup)
    return [*readout_rows(logits, targets), _entropy(logits) if entropy else None]


def _logits(head: Head, rows: Tensor, regroup: Optional[Head]) -> Tensor:
    logits = head(rows)
    return logits if regroup is None else regroup(logits)


@torch.no_grad()
def chunked_readout(
    head: Union[Head, Sequence[Head]],
    features: Tensor,
    targets: Optional[Tensor] = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    regroup: Optional[Head] = None,
    entropy: bool = False,
    reference: bool = False,
) -> Readout:
    """The one readout: the head's argmax, top-1 probability and target cross-entropy at every layer, no logits kept.

    Every path that reads a layer through a head comes here: the modules' evaluation steps (:func:`read_layers`),
    the probes, the callbacks' hooks on a user's own model, early exit and the ``lens`` command.

    Args:
        head: the shared head, or one head per layer as a sequence of length L (a tuned lens: :class:`TranslatedHead`
            per layer).
        features: ``(L, N, d)``.
        targets: ``(N,)`` or None.
        chunk_size: rows per chunk; the extra peak memory is about one ``(chunk_size, V)`` float32 logits tensor plus
            its float64 copy. A shared head reads the ``L·N`` rows of all layers as one stream of chunks (a
            classifier's few rows in one call), separate heads one layer at a time.
        regroup: applied to the logits after the head (the data's label groups, ``data_logits``); None: as they are.
        entropy: also give the softmax entropy of every row (early exit's entropy criterion).
        reference: also give every row's ``kl_to_final`` and ``final_rank`` against the last layer's distribution
            (its head: the last of a sequence), and its entropy; the last layer's logits of each chunk of rows are
            computed once beside every layer's, so the head runs ``(L + 1) / L`` times as often.

    Returns:
        :class:`~layerwise.metrics.functional.Readout` of ``(L, N)`` tensors (probabilities and losses float64).
    """
    layers, rows = features.shape[:2]
    if reference:
        return _referenced_readout(head, features, targets, chunk_size, regroup)
    if isinstance(head, (list, tuple)):
        streams = [(layer_head, layer, targets) for layer_head, layer in zip(head, features)]
    else:  # one head for every layer: the layers' rows are one stream of rows
        streams = [(head, features.flatten(0, 1), None if targets is None else targets.repeat(layers))]
    parts = [
        _read(
            stream_head,
            part,
            None if part_targets is None else part_targets[start : start + chunk_size],
            regroup,
            entropy,
        )
        for stream_head, stream, part_targets in streams
        for start, part in zip(range(0, stream.shape[0], chunk_size), stream.split(chunk_size))
    ]
    if not parts:
        return _empty(features, targets, entropy)
    fields = (None if field[0] is None else torch.cat(field).view(layers, rows) for field in zip(*parts))
    return Readout(*fields)  # type: ignore[arg-type]  # predictions and max_prob are never None


def _referenced_readout(
    head: Union[Head, Sequence[Head]],
    features: Tensor,
    targets: Optional[Tensor],
    chunk_size: int,
    regroup: Optional[Head],
) -> Readout:
    """Every field of :class:`Readout`, row chunk by row chunk: the last layer's logits once per chunk."""
    layers, rows = features.shape[:2]
    heads: list[Head] = list(head) if isinstance(head, (list, tuple)) else [head] * layers  # type: ignore[list-item]
    if rows == 0:
        empty = _empty(features, targets, True)
        return empty._replace(kl_to_final=empty.max_prob, final_rank=empty.max_prob)
    chunks = []
    for start in range(0, rows, chunk_size):
        part = slice(start, start + chunk_size)
        final = _logits(heads[-1], features[-1, part], regroup)
        fields = []
        for index, (layer_head, layer) in enumerate(zip(heads, features)):
            logits = final if index == layers - 1 else _logits(layer_head, layer[part], regroup)
            part_targets = None if targets is None else targets[part]
            fields.append([*readout_rows(logits, part_targets), _entropy(logits), *reference_rows(logits, final)])
        chunks.append([None if field[0] is None else torch.stack(field) for field in zip(*fields)])
    return Readout(*(None if field[0] is None else torch.cat(field, dim=1) for field in zip(*chunks)))  # type: ignore


def _empty(features: Tensor, targets: Optional[Tensor], entropy: bool) -> Readout:
    """The readout of no rows."""
    shape, device = features.shape[:2], features.device
    empty = torch.empty(shape, dtype=torch.float64, device=device)
    nll = None if targets is None else empty
    return Readout(torch.empty(shape, dtype=torch.long, device=device), empty, nll, empty if entropy else None)


class TranslatedHead:
    """A layer's head through its tuned-lens translator: ``head(h + A h + b)`` (Belrose et al. 2023, eq. 2).

    ``translator`` is an ``nn.Linear(d, d)`` (``A``, ``b``; zero at the start, so the head starts as the logit lens),
    applied in its own dtype; its output is added to ``h`` as tuned-lens's ``TunedLens.transform_hidden`` does.
    A head like any other: :func:`chunked_readout` reads a layer through it, the tuned lens trains through it.
    """

    def __init__(self, head: Head, translator: torch.nn.Linear) -> None:
        self.head, self.translator = head, translator

    def translate(self, h: Tensor) -> Tensor:
        """``h + A h + b`` in the translator's dtype, cast back to ``h``'s."""
        weight = self.translator.weight
        return h + self.translator(h.to(weight.dtype)).to(h.dtype)

    def __call__(self, h: Tensor) -> Tensor:
        return self.head(self.translate(h))


@dataclass  # not frozen: Lightning moves a dataclass's tensors by setting its fields (predict outputs)
class LayerOutputs:
    """The one hand-off from a model to the analyses: every layer's features and the head's readout there.

    What a layerwise module's ``validation_step``/``test_step``/``predict_step`` returns (built by
    :func:`read_layers`), what the callbacks build from their hooks on a user's own model, and what every metric
    family is fed, its layers selected and the sampler's padding dropped (:meth:`select`). A user's own module may
    return one too: ``read_layers(head, features, targets)``.

    Attributes:
        features: ``(L, N, d)`` the residual stream after each block (pooled per sample), before any final norm.
        readout: the shared head's :class:`~layerwise.metrics.functional.Readout` at every layer, ``(L, N)`` each:
            argmax, top-1 probability and target cross-entropy (the sufficient statistics of every prediction
            metric; the same fields for classifiers and language models, no logits).
        targets: ``(N,)`` class of each sample (a language model's next token), or None (unlabelled ``predict``).
        exit_readout: the readout of separate exit heads (``MultiExit``), or None.
        sample_index: ``(N,)`` the batch row of each sample where one input gives many (a language model's tokens;
            rows whose target is ignored are already dropped), used to drop the sampler's padding; None: row i is
            batch row i.
        positions: ``(N,)`` each sample's position in its sequence (to subsample tokens), or None.
        sampled: the rows kept for the feature-similarity statistics (:meth:`select` with a token stride); None: all.
    """

    features: Tensor
    readout: Readout
    targets: Optional[Tensor] = None
    exit_readout: Optional[Readout] = None
    sample_index: Optional[Tensor] = None
    positions: Optional[Tensor] = None
    sampled: Optional[Tensor] = None

    def __post_init__(self) -> None:
        features, predictions = self.features, self.readout.predictions
        if features.ndim != 3 or predictions.shape != features.shape[:2]:
            raise ValueError(
                f"Expected features (L, N, d) and a readout of (L, N) with the same L and N, got features "
                f"{tuple(features.shape)} and predictions {tuple(predictions.shape)}."
            )
        if self.targets is not None and tuple(self.targets.shape) != tuple(features.shape[1:2]):
            raise ValueError(
                f"Expected targets of shape (N,) = ({features.shape[1]},), got {tuple(self.targets.shape)}."
            )

    def select(self, layers: Tensor, budget: Optional[int], token_stride: int = 1) -> tuple["LayerOutputs", int]:
        """The ``layers`` (0-based) of the real samples, and how many dataloader samples were used.

        ``budget`` is how many real samples this rank still has (``DistributedSampler`` pads at the end; None: no
        padding to drop, and the count is 0: for a language model it reads the device); ``token_stride`` keeps every
        ``token_stride``-th position in ``sampled``. The result holds no ``sample_index``/``positions``.
        """
        rows = self._real_rows(budget)
        used = self._samples_in(rows) if budget is not None else 0
        layers = layers.to(self.features.device)

        def pick(value: Tensor) -> Tensor:
            return value.index_select(0, layers)[:, rows]

        sampled = None
        if self.positions is not None and token_stride > 1:
            sampled = torch.nonzero(self.positions[rows] % token_stride == 0).flatten()
        targets = None if self.targets is None else self.targets[rows]
        exits = None if self.exit_readout is None else _mapped(self.exit_readout, pick)
        selected = LayerOutputs(pick(self.features), _mapped(self.readout, pick), targets, exits, sampled=sampled)
        return selected, used

    def _real_rows(self, budget: Optional[int]) -> Union[slice, Tensor]:
        """The rows that belong to real samples (``DistributedSampler`` pads at the end)."""
        if budget is None:
            return slice(None)
        if self.sample_index is None:
            return slice(0, budget)
        return torch.nonzero(self.sample_index < budget).flatten()

    def _samples_in(self, rows: Union[slice, Tensor]) -> int:
        """How many dataloader samples the kept rows cover (a language model's sequence has many rows)."""
        if self.sample_index is None:
            return len(range(*rows.indices(self.features.shape[1]))) if isinstance(rows, slice) else rows.numel()
        kept = self.sample_index[rows]
        return 0 if kept.numel() == 0 else int(kept.max()) + 1

    def nonfinite_rows(self) -> Tensor:
        """(L, N) bool: the rows whose feature, top-1 probability or loss is NaN or infinite, per layer."""
        bad = ~torch.isfinite(self.features).all(dim=-1)
        for value in (self.readout.max_prob, self.readout.nll):
            if value is not None:
                bad |= ~torch.isfinite(value)
        return bad

    def keep(self, rows: Tensor) -> "LayerOutputs":
        """The outputs restricted to the rows where ``rows`` (N,) bool is True (``sampled`` renumbered)."""

        def take_rows(value: Optional[Tensor]) -> Optional[Tensor]:
            return None if value is None else value[rows]

        sampled = self.sampled
        if sampled is not None:
            position = torch.cumsum(rows.long(), 0) - 1
            sampled = position[sampled[rows[sampled]]]
        return LayerOutputs(
            self.features[:, rows],
            _mapped(self.readout, lambda value: value[:, rows]),
            take_rows(self.targets),
            None if self.exit_readout is None else _mapped(self.exit_readout, lambda value: value[:, rows]),
            take_rows(self.sample_index),
            take_rows(self.positions),
            sampled,
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by the tensors (features, readouts, targets, row indices)."""
        readouts = [value for readout in (self.readout, self.exit_readout) if readout is not None for value in readout]
        tensors = [self.features, self.targets, self.sample_index, self.positions, self.sampled, *readouts]
        return sum(value.numel() * value.element_size() for value in tensors if value is not None)

    @classmethod
    def cat(cls, batches: Sequence["LayerOutputs"]) -> "LayerOutputs":
        """One value of ``batches``' rows in order; one batch is returned as is.

        ``sampled`` is renumbered; ``sample_index`` and ``positions``, which restart at every batch, are dropped.
        """
        if len(batches) == 1:
            return batches[0]
        first = batches[0]

        def join(values: list[Optional[Tensor]], dim: int) -> Optional[Tensor]:
            return None if values[0] is None else torch.cat(values, dim=dim)  # type: ignore[arg-type]

        def readouts(pick: Callable[["LayerOutputs"], Optional[Readout]]) -> Optional[Readout]:
            if pick(first) is None:
                return None
            fields = range(len(Readout._fields))
            return Readout(*(join([pick(batch)[field] for batch in batches], 1) for field in fields))  # type: ignore

        sampled = None
        if any(batch.sampled is not None for batch in batches):
            parts, offset = [], 0
            for batch in batches:
                rows = batch.features.shape[1]
                index = batch.sampled if batch.sampled is not None else torch.arange(rows, device=batch.features.device)
                parts.append(index + offset)
                offset += rows
            sampled = torch.cat(parts)
        return cls(
            torch.cat([batch.features for batch in batches], dim=1),
            readouts(lambda batch: batch.readout),  # type: ignore[arg-type]
            join([batch.targets for batch in batches], 0),
            readouts(lambda batch: batch.exit_readout),
            sampled=sampled,
        )

    @property
    def sampled_features(self) -> Tensor:
        """The features of the rows kept for COS/CKA/saturation-COS: ``(L, N', d)``."""
        return self.features if self.sampled is None else self.features[:, self.sampled]


def _mapped(readout: Readout, change: Callable[[Tensor], Tensor]) -> Readout:
    """``change`` applied to every tensor of a readout (its None fields stay None)."""
    return Readout(*(None if value is None else change(value) for value in readout))  # type: ignore[arg-type]


@torch.no_grad()
def read_layers(
    head: Union[Head, Sequence[Head]],
    features: Tensor,
    targets: Optional[Tensor] = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    exit_heads: Optional[Sequence[Head]] = None,
    regroup: Optional[Head] = None,
    sample_index: Optional[Tensor] = None,
    positions: Optional[Tensor] = None,
) -> LayerOutputs:
    """The :class:`LayerOutputs` of every layer's ``features`` ``(L, N, d)``: the shared ``head`` read at each layer.

    ``head`` may also be one head per layer (``LinearProbes``: every layer read by its own probe).
    ``exit_heads`` (one per layer) are read as well (``exit_readout``); ``regroup`` maps the logits of every head to
    the data's classes; the rest as in :class:`LayerOutputs` and :func:`chunked_readout`.
    """
    readout = chunked_readout(head, features, targets, chunk_size, regroup)
    exits = None if exit_heads is None else chunked_readout(list(exit_heads), features, targets, chunk_size, regroup)
    return LayerOutputs(features, readout, targets, exits, sample_index, positions)


@dataclass(frozen=True)
class HeadInput:
    """The shared head split at its last linear layer: the steps that feed it (float64) and its weight.

    Neural collapse's NC3 compares the class means of the features that layer reads with its rows; at layer l those
    are ``steps(h_l)`` (the final norm, a pooler, ...), the head's own path to its last linear layer.

    Attributes:
        steps: the head's steps before its last ``nn.Linear``, a float64 copy in evaluation mode.
        weight: ``(C, d')`` float64 copy of that layer's weight (its bias, a shift of every logit, plays no part).
    """

    steps: nn.Module
    weight: Tensor


def split_head(head: nn.Module) -> Optional[HeadInput]:
    """The head (a copy it may change, e.g. ``Backbone.head_modules()``) split at its last linear layer.

    The head is read as a sequence of steps (an ``nn.Sequential``'s children, else the one module); None when no step
    is an ``nn.Linear`` or a step other than dropout or identity follows the last one (then no layer is "the one the
    logits come from").
    """
    steps = list(head) if isinstance(head, nn.Sequential) else [head]
    linear = [index for index, step in enumerate(steps) if isinstance(step, nn.Linear)]
    if not linear or any(not isinstance(step, (nn.Dropout, nn.Identity)) for step in steps[linear[-1] + 1 :]):
        return None
    last: nn.Linear = steps[linear[-1]]  # an nn.Linear, found above
    prefix = nn.Sequential(*steps[: linear[-1]]).to(torch.float64).eval()
    return HeadInput(prefix, last.weight.detach().to(torch.float64).clone())


@torch.no_grad()
def chunked_head_inputs(head: HeadInput, features: Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """What the head's last linear layer reads at every layer: ``head.steps`` of ``features`` ``(L, N, d)``, float64.

    Returns ``(L, N, d')``; rows in chunks of ``chunk_size``, as :func:`chunked_readout`.
    """
    layers, rows = features.shape[:2]
    stream = features.flatten(0, 1).to(torch.float64)
    if stream.shape[0] == 0:
        return stream.new_zeros(layers, rows, head.weight.shape[1])
    parts = [head.steps(part) for part in stream.split(chunk_size)]
    return torch.cat(parts).view(layers, rows, -1)
