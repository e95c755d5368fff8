"""What a per-layer analysis is: a plain object with its options, the statistics it reads and its results.

Not a Lightning callback: :class:`~layerwise.callbacks.LayerwiseAnalysis` is the one callback that runs analyses
(the package's and a user's in ``more=``) over one pool of statistics (:mod:`layerwise.analyses.pool`).
"""

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from torch import nn
from torchmetrics import Metric

from layerwise.analyses.layer_spec import LayerSpec
from layerwise.engines.readout import LayerOutputs
from layerwise.errors import UsageError

HeadReader = Callable[[], Optional[nn.Module]]  # a copy of the shared head (final norm + classifier) as it is now


@dataclass(frozen=True)
class RunModel:
    """The model under evaluation as an analysis may read it (:meth:`Analysis.use_model`).

    Attributes:
        module: the LightningModule (a layerwise module, or a user's own).
        tap: the hooks on a user's own model (``features.hooks.HookTap``: its ``head``), None for a layerwise module.
        head: ``head()``, a copy of the shared head as it is at the call (None where it is not known).
    """

    module: Any
    tap: Any
    head: HeadReader


Metrics = dict[str, Metric]  # one analysis's statistics for one evaluation dataloader, by its own names

# The options of the callback that runs the analyses: an analysis given one is refused in one line naming where it goes
RUNNER_OPTIONS = (
    "every_n_epochs",
    "layers",
    "save_features",
    "print_table",
    "log_figures",
    "figures_every_n_epochs",
    "source",
    "blocks",
    "final_norm",
    "classifier",
    "pooling",
    "token_stride",
)


@dataclass(frozen=True)
class Statistic:
    """A statistic by name: how to build its metric and how a batch feeds it.

    Statistics are shared by name: two analyses declaring the same ``name`` read one metric, built and fed once per
    evaluation dataloader (the first declaration's ``build`` and ``feed``). So the name says everything the state
    depends on besides the layers, e.g. ``"cos(center=True, buffer=65536, bins=400)"``.

    Attributes:
        name: the pool's key.
        build: a fresh metric (a layerwise sum-state metric with ``sync_on_compute=False`` travels in the pool's one
            all-reduce; a plain torchmetrics ``Metric`` syncs itself in its ``compute``).
        feed: ``feed(metric, batch)``: update the metric with consecutive batches joined into one
            (:class:`~layerwise.engines.readout.LayerOutputs`, the selected layers, real rows only).
        joins_batches: False for an estimator defined per dataloader batch (the minibatch CKA): then the pool is fed
            batch by batch.
    """

    name: str
    build: Callable[[], Metric]
    feed: Callable[[Metric, LayerOutputs], None]
    joins_batches: bool = True


class Analysis:
    """Base of a per-layer analysis: a plain object run by :class:`~layerwise.callbacks.LayerwiseAnalysis`.

    A subclass takes its options in ``__init__`` (stored as public attributes of the same names: they are its
    recorded options, :meth:`options`) and says, for the selected layers (:attr:`spec`): the statistics it reads
    (:meth:`statistics`, by name: shared with every other analysis that declares the same), its results
    (:meth:`results`: a pure function of the reduced statistics and of other analyses' results it :attr:`reads`), its
    scalars and charts (:meth:`layer_scalars`, :meth:`layer_charts`), its console :meth:`line` and its figure
    (:attr:`figures`, a module-level function of the summary). Its results are top-level keys of the evaluation's
    summary; the summary's ``analyses`` records its class and options under :attr:`name`.

    Attributes:
        name: the analysis's name in the summary's ``analyses`` (default: the class name in snake case).
        provides: the result keys other analyses may read (:attr:`reads`).
        reads: results of other analyses it reads in :meth:`results`, by key: those analyses compute before it,
            whatever the order they were given in.
        figures: a module-level function of the summary -> ``{name: figure}`` (``staticmethod(function)``), drawn
            off the training loop and by ``layerwise plot``/``report``; None: no figure.
    """

    name: ClassVar[str] = ""
    provides: ClassVar[tuple[str, ...]] = ()
    reads: ClassVar[tuple[str, ...]] = ()
    figures: ClassVar[Any] = None
    spec: LayerSpec  # the selected layers: set before configure

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):
            cls.name = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()

    def configure(self, spec: LayerSpec, datamodule: Any) -> None:
        """Read what it needs of the run before :meth:`statistics` (``datamodule``: the trainer's, or None)."""

    def use_model(self, model: "RunModel") -> None:
        """Take what the runner says of the model under evaluation, before every evaluation; default: unused.

        NC3 reads the shared head as it is then (a head trained meanwhile is read afresh); the logit lens reads every
        layer through a tuned lens file with the module's own head.
        """

    def statistics(self, spec: LayerSpec) -> dict[str, Statistic]:
        """The statistics it reads, by its own names (the keys :meth:`results` gets them under)."""
        return {}

    def results(self, metrics: Metrics, earlier: Mapping[str, Any]) -> dict[str, Any]:
        """Results keyed as in the JSON summary, from the reduced statistics (a collective: every rank computes).

        ``earlier``: the results of the analyses computed before it, among them every key of :attr:`reads`.
        """
        return {}

    def layer_scalars(self, results: Mapping[str, Any]) -> dict[str, float]:
        """Scalars to log from the results, keyed without the stage prefix, e.g. ``acc/layer_03``."""
        return {}

    def layer_charts(self) -> dict[str, str]:
        """Multi-line charts: title -> regex of scalar names without the stage (all layers of one quantity)."""
        return {}

    def line(self, results: Mapping[str, Any]) -> str:
        """Its console line on the JSON results ("": none; the package's are in the per-layer table)."""
        return ""

    def columns(self, results: Mapping[str, Any]) -> dict[str, str]:
        """Its per-layer results (JSON) shown as columns of the report's table and curves: key -> title.

        Default: every key of its results that holds one number per selected layer, titled by the key in words.
        """
        layers = len(self.spec.layer_numbers)
        return {
            key: key.replace("_", " ")
            for key, value in results.items()
            if isinstance(value, list) and len(value) == layers and all(_number(item) for item in value)
        }

    def options(self) -> dict[str, Any]:
        """What it was asked for, recorded in the summary: its public attributes holding JSON values."""
        return {key: value for key, value in vars(self).items() if not key.startswith("_") and _plain(value)}

    # Given to a Trainer as a callback, it is refused when the Trainer is built: Lightning's check of its callbacks
    # reads the `state_key` of every callback with its own `state_dict`.
    def state_dict(self) -> dict[str, Any]:
        """Nothing to resume: its statistics are rebuilt at every evaluation."""
        return {}

    @property
    def state_key(self) -> str:
        """Read by a Trainer given it as a callback: refused in one line that says where it goes."""
        raise UsageError(
            f"{type(self).__name__} is an analysis, not a callback: run it in LayerwiseAnalysis "
            f"(LayerwiseAnalysis(more=[{type(self).__name__}(...)]), or the option of the package's analysis)."
        )


def refuse_runner_options(owner: str, given: Mapping[str, Any]) -> None:
    """An analysis's ``**given`` options: those of LayerwiseAnalysis said where they go, others said unknown."""
    for option, value in given.items():
        if option in RUNNER_OPTIONS:
            raise UsageError(
                f"{owner}({option}={value!r}): `{option}` is an option of LayerwiseAnalysis, which runs the analyses "
                f"on its features: give LayerwiseAnalysis({option}={value!r}, ...)."
            )
        raise TypeError(f"{owner} has no option `{option}`: see help({owner}).")


def _number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _plain(value: Any) -> bool:
    """A JSON value of numbers, strings, booleans, None, lists and string-keyed dicts."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _plain(item) for key, item in value.items())
    return False


def resolve_order(analyses: Sequence[Analysis]) -> list[Analysis]:
    """The analyses in their given order, each moved after those whose results it :attr:`~Analysis.reads`.

    A key is provided by the analyses that list it in :attr:`~Analysis.provides`. One line names the analysis and the
    key when no analysis provides it, or when analyses read each other's results in a circle.
    """
    providers = {key: analysis for analysis in analyses for key in analysis.provides}
    ordered: list[Analysis] = []
    visiting: set[int] = set()

    def visit(analysis: Analysis) -> None:
        if any(analysis is done for done in ordered):
            return
        if id(analysis) in visiting:
            raise UsageError(f"{type(analysis).__name__} reads results of analyses that read its own: a circle.")
        visiting.add(id(analysis))
        for key in analysis.reads:
            if key not in providers:
                raise UsageError(
                    f"{type(analysis).__name__} reads `{key}`, which no analysis of this LayerwiseAnalysis provides "
                    f"(provided: {', '.join(sorted(providers)) or 'none'})."
                )
            if providers[key] is not analysis:
                visit(providers[key])
        visiting.discard(id(analysis))
        ordered.append(analysis)

    for analysis in analyses:
        visit(analysis)
    return ordered
