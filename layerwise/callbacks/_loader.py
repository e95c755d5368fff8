"""What one evaluation dataloader accumulates for LayerwiseAnalysis (its pool of statistics), and its one reduction."""

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torchmetrics import Metric

from layerwise.analyses.base import Analysis, Metrics
from layerwise.analyses.layer_spec import LayerSpec
from layerwise.analyses.pool import Pool
from layerwise.callbacks._output import FeatureSaver
from layerwise.engines.readout import LayerOutputs
from layerwise.engines.sampling import rank_indices, real_samples_on_rank
from layerwise.errors import LayerwiseWarning
from layerwise.metrics import NonFiniteRows, SampleCount, all_reduce_sum_states

# Held batches are joined and fed together once they hold this many bytes or batches: the metrics' updates then cost
# the host (Python, dispatch, kernel launches) once per group instead of once per batch, and a GPU's kernels run on
# larger inputs. Bounded: at most one group held and one in its check (a batch past the bytes is fed at once).
GROUP_BYTES = 32 * 2**20
GROUP_BATCHES = 16


class _Pending(NamedTuple):
    """Joined batches whose non-finite check is still on its way to the host (read when the next group is joined)."""

    batch: LayerOutputs
    bad: Tensor  # (L, N) bool, on the batch's device
    any_bad: Tensor  # 0-dim bool on the host, written by a non-blocking copy
    copied: Optional[torch.cuda.Event]  # recorded after that copy (None on the CPU: nothing in flight)


@dataclass
class LoaderState:
    """One evaluation dataloader's pool of statistics, sample count, non-finite rows, padding budget, saved features."""

    analyses: Sequence[Analysis]  # in the order their results are computed (those read by others first)
    pool: Pool  # every analysis's statistics, each once
    views: list[Metrics]  # each analysis's statistics under its own names, in the order of ``analyses``
    count: SampleCount
    nonfinite: NonFiniteRows
    budget: Optional[int] = None
    saver: FeatureSaver = field(default_factory=FeatureSaver)
    held: list[LayerOutputs] = field(default_factory=list)
    held_bytes: int = 0
    save_features: bool = False
    pending: Optional[_Pending] = None

    @classmethod
    def build(cls, analyses: Sequence[Analysis], spec: LayerSpec) -> "LoaderState":
        """The pool of ``analyses``' statistics for ``spec``, with the sample count and the non-finite rows."""
        count = SampleCount(sync_on_compute=False)
        nonfinite = NonFiniteRows(len(spec.layer_numbers), sync_on_compute=False)
        pool, views = Pool.of(analyses, spec)
        return cls(analyses, pool, views, count, nonfinite)

    @property
    def metrics(self) -> list[Metric]:
        """Every metric of the dataloader: the count, the non-finite rows and the pool's statistics."""
        return [self.count, self.nonfinite, *self.pool]

    def start(self, loader: Any, keep_indices: bool) -> None:
        """A new epoch over ``loader``: this rank's padding budget and a fresh feature saver (with sample indices)."""
        self.budget = real_samples_on_rank(loader)
        self.saver = FeatureSaver()
        self.saver.indices = rank_indices(loader) if keep_indices else None

    def collect(self, outputs: LayerOutputs, selection: Tensor, token_stride: int, save_features: bool) -> None:
        """Take one batch's real samples (the sampler's padding dropped); non-finite rows are counted and skipped.

        The batches are held and joined into groups of up to :data:`GROUP_BYTES` or :data:`GROUP_BATCHES` (one
        batch where an analysis's estimator is defined per batch, e.g. the minibatch CKA), and each group is fed at
        once: the same rows in the same order, with the host's per-update cost paid once per group. Whether a group
        holds non-finite rows is known on the device; reading it on the host would stall the loop until the group's
        forwards have run (on a GPU, the next batch could no longer be prepared meanwhile). So the answer travels by
        a non-blocking copy, and the group is fed when the next one is joined (or at :meth:`reduce`): by then the
        copy has long landed.
        """
        layer_batch, used = outputs.select(selection, self.budget, token_stride)
        if self.budget is not None:
            self.budget -= used
        if layer_batch.features.shape[1] == 0:
            return
        if layer_batch.targets is None or layer_batch.readout.nll is None:
            raise ValueError("The batch holds no targets: the analysis needs labels ('labels' key or batch[1]).")
        self.save_features = save_features
        self.held.append(layer_batch)
        self.held_bytes += layer_batch.nbytes
        most = GROUP_BATCHES if self.pool.joins_batches else 1
        if self.held_bytes >= GROUP_BYTES or len(self.held) >= most:
            self._check_held()

    def _check_held(self) -> None:
        """Join the held batches, start their non-finite check, and feed the group checked before them."""
        if not self.held:
            return
        layer_batch = LayerOutputs.cat(self.held)
        self.held, self.held_bytes = [], 0
        self._feed_checked()
        bad = layer_batch.nonfinite_rows()
        if bad.is_cuda:
            any_bad = torch.empty((), dtype=torch.bool, pin_memory=True).copy_(bad.any(), non_blocking=True)
            copied: Optional[torch.cuda.Event] = torch.cuda.Event()
            copied.record()
        else:
            any_bad, copied = bad.any(), None
        self.pending = _Pending(layer_batch, bad, any_bad, copied)

    def feed_pending(self) -> None:
        """Feed every batch taken so far: the group in its check (waits for that copy only), then the held ones."""
        self._check_held()
        self._feed_checked()

    def _feed_checked(self) -> None:
        """Feed the group whose non-finite check was in flight."""
        if self.pending is None:
            return
        layer_batch, bad, any_bad, copied = self.pending
        self.pending = None
        if copied is not None:
            copied.synchronize()
        if bool(any_bad):  # skipped and counted: one NaN sample must not abort training or poison the others
            self.nonfinite.update(bad)
            layer_batch = layer_batch.keep(~bad.any(dim=0))
            if layer_batch.features.shape[1] == 0:
                return
        self.count.update(layer_batch.features.shape[1])
        self.pool.update(layer_batch)  # every statistic once, however many analyses read it
        if self.save_features:
            self.saver.keep(layer_batch)

    def reduce(self, spec: LayerSpec, stage: str, owner: str) -> tuple[int, list[dict[str, Any]]]:
        """One all-reduce, then the number of samples and each analysis's results (a collective: every rank)."""
        self.feed_pending()
        # the package's sum-state metrics (sync_on_compute=False) in one all-reduce; a plain torchmetrics Metric of a
        # user's analysis syncs its own states in its compute, as AnalysisCallback.metrics says
        all_reduce_sum_states([metric for metric in self.metrics if not metric.sync_on_compute])
        with warnings.catch_warnings():
            # The states were summed over every rank above; torchmetrics counts the updates of this rank only, and
            # would say "compute before update" on a rank without samples, or for every metric when every sample was
            # skipped (said below, in one line).
            warnings.filterwarnings("ignore", message=r"The ``compute`` method of metric .* before the ``update``")
            num_samples = int(self.count.compute().item())
            results: dict[str, Any] = {}  # what the analyses computed so far: what a later one reads
            each = []
            for analysis, metrics in zip(self.analyses, self.views):
                each.append(analysis.results(metrics, results))
                results.update(each[-1])
        nonfinite = self.nonfinite.per_layer  # the reduced state
        if bool(nonfinite.any()):
            layers = {number: int(count) for number, count in zip(spec.layer_numbers, nonfinite.tolist()) if count}
            rank_zero_warn(
                f"{owner}: skipped {int(self.nonfinite.rows)} {stage} samples with non-finite values "
                f"(NaN/inf rows per layer: {layers}); `n_nonfinite` in the summary counts them.",
                category=LayerwiseWarning,
            )
        return num_samples, each

    def reset(self) -> None:
        """Zero every metric for the next epoch (also after a failed one)."""
        self.pending = None
        self.held, self.held_bytes = [], 0
        for metric in self.metrics:
            metric.reset()
