"""One pool of statistics per evaluation dataloader: each accumulated once however many analyses read it."""

from collections.abc import Iterable, Iterator, Sequence

from torchmetrics import Metric

from layerwise.analyses.base import Analysis, Metrics, Statistic
from layerwise.analyses.layer_spec import LayerSpec
from layerwise.engines.readout import LayerOutputs


class Pool:
    """The statistics of a set of analyses, by name, as torchmetrics' compute groups share states.

    Built from the union of the analyses' declarations (:meth:`Analysis.statistics`): a name declared by several
    analyses is one metric, fed once per batch group; :meth:`view` gives each analysis its statistics under its own
    names. The sum-state metrics (``sync_on_compute=False``) are listed by :meth:`summed` for the one all-reduce of
    the evaluation (``metrics.sync.all_reduce_sum_states``).
    """

    def __init__(self, statistics: Iterable[Statistic]) -> None:
        self.statistics: dict[str, Statistic] = {}
        for statistic in statistics:
            self.statistics.setdefault(statistic.name, statistic)
        self.metrics: dict[str, Metric] = {name: statistic.build() for name, statistic in self.statistics.items()}
        self.joins_batches = all(statistic.joins_batches for statistic in self.statistics.values())

    @classmethod
    def of(cls, analyses: Sequence[Analysis], spec: LayerSpec) -> tuple["Pool", list[Metrics]]:
        """The pool of ``analyses``' statistics for ``spec``, and each analysis's view of it, in order."""
        declared = [analysis.statistics(spec) for analysis in analyses]
        pool = cls(statistic for statistics in declared for statistic in statistics.values())
        return pool, [pool.view(statistics) for statistics in declared]

    def view(self, declared: dict[str, Statistic]) -> Metrics:
        """An analysis's statistics under its own names: the pool's metrics of those names."""
        return {alias: self.metrics[statistic.name] for alias, statistic in declared.items()}

    def update(self, batch: LayerOutputs) -> None:
        """Feed every statistic once with ``batch``."""
        for name, statistic in self.statistics.items():
            statistic.feed(self.metrics[name], batch)

    def summed(self) -> list[Metric]:
        """The metrics whose states travel in the evaluation's one all-reduce (``sync_on_compute=False``)."""
        return [metric for metric in self.metrics.values() if not metric.sync_on_compute]

    def __iter__(self) -> Iterator[Metric]:
        return iter(self.metrics.values())

    def __len__(self) -> int:
        return len(self.metrics)
