"""Several runs side by side, in numbers: which epoch, which group, each group's mean and 95 % t-interval over seeds.

Pure functions over plain data (configs as nested dicts, summaries as the JSON objects of :mod:`layerwise.results`):
numpy (and scipy's t quantile), no matplotlib, no file. ``layerwise plot RUN...`` and ``layerwise report RUN...``
draw their figures and write their table from :func:`comparison_rows`.

- **Groups.** Runs whose configs differ only by seeds (``seed_everything``, any ``seed`` or ``*_seed`` option) and by
  where they write (logger, folders) form one group, labelled by what differs between the groups (:func:`group_runs`):
  ``standard`` against ``alternating aligned`` when the model's class differs (the class in words), ``depth=3``
  against ``depth=6`` when the backbone's depth does. Labels given by the user group the runs that share a label.
- **Epoch.** One epoch for every run (:func:`choose_epoch`): ``last`` (the latest epoch that every run validated),
  a number, or ``best:<key>`` (the epoch at which the runs' mean of that summary key, at the last layer for a
  per-layer key, is highest; lowest for a loss).
- **Statistics.** A group of ``n`` runs gives, at every point (layer, ε, τ), the mean of its runs' finite values and
  the half-width of the 95 % Student-t interval ``t_{0.975, n-1} · s / √n`` with ``s`` the sample standard
  deviation (:func:`t_interval`; no interval for ``n = 1``), ``t`` from ``scipy.stats.t.ppf``.
- **Range.** The interval is a statement about a mean the quantity can take: its ends (:attr:`Row.low`,
  :attr:`Row.high`, the band drawn, the table's ``low``/``high``) are clipped to the quantity's range
  (:data:`RANGES`: accuracy and CKA in [0, 1], COS in [-1, 1], NC1, CDNV, NC2 and NC3 >= 0, NC4's agreement and
  accuracy in [0, 1], the lens's KL to the final distribution >= 0, speedup >= 1, ε-effective depth between the
  first and the last layer; every quantity drawn has its range); ``half_width`` stays the unclipped t-interval's.
- **Not reached.** ε-effective depth where no layer reaches ``1 − ε`` is the last layer by the paper's convention;
  a summary that says so (``effective_depth_reached``: false) gives no value there (NaN), and the row counts the
  runs that did not reach it (:attr:`Row.unreached`): the table writes "not reached", never the last layer.
- **Table.** ``mean ± half-width`` with the half-width to two significant digits and the mean to the same place
  (three significant digits without an interval); accuracies in %.
"""

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

# per-layer quantity -> its words (figures, table)
QUANTITIES = {
    "accuracy": "accuracy of the shared head",
    "cos": "COS to the last layer",
    "cka": "CKA to the last layer",
    "nc1": "NC1 (within- / between-class variability)",
    # neural collapse complete (NeuralCollapseMonitor(complete=True); NC4 with ncc=True)
    "cdnv": "CDNV (class-distance normalised variance)",
    "nc2_equinorm": "NC2 equinorm (CV of the class-mean norms)",
    "nc2_equiangular": "NC2 equiangularity (mean |cos + 1/(K-1)|)",
    "nc2_etf": "NC2 simplex-ETF error",
    "nc3": "NC3 distance of class means to the head's rows",
    "nc4_agreement": "NC4 agreement of the NCC with the head",
    "kl_to_final": "KL to the final layer's distribution (nats)",
    "effective_depth": "ε-effective depth",
    "early_exit_accuracy": "early-exit accuracy",
    "early_exit_speedup": "early-exit speedup",
}
# the values each quantity can take: a band is clipped to them (effective depth: the layers, set per comparison)
RANGES = {
    "accuracy": (0.0, 1.0),
    "cos": (-1.0, 1.0),
    "cka": (0.0, 1.0),
    "nc1": (0.0, math.inf),
    # neural collapse: variabilities, norms' CV and distances are >= 0; NC4's shares of samples in [0, 1]
    **dict.fromkeys(
        ("cdnv", "nc2_equinorm", "nc2_cos_std", "nc2_equiangular", "nc2_etf", "nc3", "nc3_duality"), (0.0, math.inf)
    ),
    "nc4_agreement": (0.0, 1.0),
    "nc4_ncc_accuracy": (0.0, 1.0),
    "kl_to_final": (0.0, math.inf),  # a KL divergence: >= 0, unbounded above
    "early_exit_accuracy": (0.0, 1.0),
    "early_exit_speedup": (1.0, math.inf),
}
PERCENT = ("accuracy", "early_exit_accuracy")  # written in % in the table
WHOLE = ("effective_depth",)  # whole numbers: integer ticks
# what each quantity's x is
POSITIONS = {"effective_depth": "ε", "early_exit_accuracy": "τ", "early_exit_speedup": "τ"}
LOWER_IS_BETTER = (
    "loss",
    "nc1",
    "cdnv",
    "nc2",
    "nc3",
    "kl_to_final",
)  # `--epoch best:<key>` minimises keys containing these
PER_LAYER = (
    "accuracy",
    "nc1",
    "cdnv",
    "nc2_equinorm",
    "nc2_equiangular",
    "nc2_etf",
    "nc3",
    "nc4_agreement",
    "kl_to_final",
)
# config options that say where a run writes, not what it computes: never a difference between runs
WHERE_KEYS = ("trainer.logger", "trainer.default_root_dir", "trainer.enable_progress_bar", "ckpt_path", "threads")
WHERE_PARTS = ("dirpath", "save_dir", "log_dir", "root_dir")


@dataclass(frozen=True)
class Group:
    """Runs drawn as one line: their indices in the order given, and the legend's label (without the seed count)."""

    label: str
    members: tuple[int, ...]


@dataclass(frozen=True)
class Row:
    """One point of one group's line: a row of the comparison table."""

    quantity: str
    group: str
    seeds: int
    x: Any
    mean: float
    half_width: float  # NaN for a group of one run (or one finite value)
    values: tuple[float, ...]  # each run's value, NaN where it has none (or where it was not reached)
    lower: float = -math.inf  # the quantity's range (RANGES): the interval's ends are clipped to it
    upper: float = math.inf
    unreached: int = 0  # runs whose value at this point was not reached (ε-effective depth: no layer >= 1 - ε)

    @property
    def low(self) -> float:
        """The interval's lower end, clipped to the quantity's range."""
        return max(self.mean - self.half_width, self.lower)

    @property
    def high(self) -> float:
        """The interval's upper end, clipped to the quantity's range."""
        return min(self.mean + self.half_width, self.upper)


# ------------------------------------------------------------------------------------------------------ statistics
def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, int]:
    """``(mean, half-width, n)`` of the finite ``values``: the Student-t interval of their mean (NaN width if n < 2)."""
    array = np.asarray([np.nan if value is None else value for value in values], dtype=float)
    array = array[np.isfinite(array)]
    n = int(array.size)
    if n == 0:
        return math.nan, math.nan, 0
    mean = float(array.mean())
    if n < 2:
        return mean, math.nan, n
    from scipy.stats import t  # here: the rest of the module needs numpy only

    half = float(t.ppf(0.5 + confidence / 2, n - 1)) * float(array.std(ddof=1)) / math.sqrt(n)
    return mean, half, n


# ------------------------------------------------------------------------------------------------------ groups
def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"model.init_args.backbone.init_args.depth": 6, ...}`` (lists kept as values)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def is_seed(key: str) -> bool:
    """Whether a flattened option is a seed: ``seed_everything``, ``...seed`` or ``..._seed``."""
    last = key.rsplit(".", 1)[-1]
    return last in ("seed_everything", "seed") or last.endswith("_seed")


def _is_where(key: str) -> bool:
    return key.startswith(WHERE_KEYS) or any(part in key for part in WHERE_PARTS)


def differences(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The flattened options that differ between ``configs``, seeds and output places left out.

    Where a ``class_path`` differs, the options under its ``init_args`` are the class's own and are not listed.
    """
    flats = [flatten(config) for config in configs]
    keys = sorted({key for flat in flats for key in flat})
    differ = [
        key
        for key in keys
        if not is_seed(key) and not _is_where(key) and len({repr(flat.get(key)) for flat in flats}) > 1
    ]
    classes = [key[: -len("class_path")] for key in differ if key.endswith("class_path")]
    return [key for key in differ if not any(key.startswith(f"{c}init_args.") for c in classes)]


def class_words(class_path: str) -> str:
    """A class in words for a legend: ``layerwise.lightning_modules.AlternatingAligned`` -> alternating aligned."""
    name = class_path.rsplit(".", 1)[-1]
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", " ", name).lower()


def _shown(key: str, value: Any) -> str:
    if key.endswith("class_path") and isinstance(value, str):
        return class_words(value)
    name = [part for part in key.split(".") if part != "init_args"][-1]
    return f"{name.replace('_', ' ')}={value}"  # in words: a legend shows it (embed dim=16, not embed_dim=16)


def group_runs(
    configs: Sequence[Optional[Mapping[str, Any]]], names: Sequence[str], labels: Optional[Sequence[str]] = None
) -> list[Group]:
    """The groups of runs drawn as one line each, in the order of their first run.

    ``configs``: each run's parsed config (None when the run has none: it forms a group of its own, labelled by its
    ``names`` entry). ``labels`` (one per run): the user's; runs that share a label are one group.
    """
    if labels is not None:
        order = list(dict.fromkeys(labels))
        return [Group(label, tuple(i for i, own in enumerate(labels) if own == label)) for label in order]
    present = {i: config for i, config in enumerate(configs) if config is not None}
    keys = differences(list(present.values()))
    flats = {i: flatten(config) for i, config in present.items()}
    groups: dict[str, list[int]] = {}
    for index, name in enumerate(names):
        if index not in flats:
            label = name
        elif keys:
            label = ", ".join(_shown(key, flats[index].get(key)) for key in keys)
        else:  # only seeds differ: one group, called by its model class
            model = flats[index].get("model.class_path")
            label = class_words(model) if isinstance(model, str) else "runs"
        groups.setdefault(label, []).append(index)
    return [Group(label, tuple(members)) for label, members in groups.items()]


# ------------------------------------------------------------------------------------------------------ epoch
def _at_last_layer(value: Any) -> Optional[float]:
    if isinstance(value, (list, tuple)):
        value = value[-1] if value else None
    return None if value is None or isinstance(value, (dict, str, bool)) else float(value)


def _spans(epochs: Sequence[int]) -> str:
    return f"{min(epochs)}-{max(epochs)}" if epochs else "none"


def choose_epoch(
    runs: Sequence[Mapping[int, Mapping[str, Any]]], names: Sequence[str], epoch: str = "last", option: str = "--epoch"
) -> tuple[int, str]:
    """The one epoch every run is drawn at, and how it was chosen in words (for the figures' titles).

    ``runs``: each run's summaries by epoch; ``epoch``: ``last``, a number, or ``best:<key>``. Errors (ValueError)
    are one line naming ``option``.
    """
    common = sorted(set.intersection(*(set(run) for run in runs)))
    if epoch == "last":
        if not common:
            have = "; ".join(f"{name} has {_spans(list(run))}" for name, run in zip(names, runs))
            raise ValueError(f"`{option}=last`: the runs share no validated epoch ({have}).")
        ends = {max(run) for run in runs}
        return common[-1], "the last" if ends == {common[-1]} else "the last all runs share"
    if epoch.startswith("best:"):
        key = epoch[len("best:") :]
        if not common:
            raise ValueError(f"`{option}={epoch}`: the runs share no validated epoch.")
        scores = []
        for number in common:
            values = [_at_last_layer(run[number].get(key)) for run in runs]
            if any(value is None for value in values):
                missing = next(name for name, value in zip(names, values) if value is None)
                raise ValueError(
                    f"`{option}={epoch}`: run {missing} has no number under {key!r} at epoch {number} "
                    "(give a summary key such as accuracy or loss)."
                )
            scores.append(float(np.mean([float(value) for value in values if value is not None])))
        lower = any(word in key for word in LOWER_IS_BETTER)
        best = common[int(np.argmin(scores) if lower else np.argmax(scores))]
        return best, f"{'lowest' if lower else 'highest'} mean {key.replace('_', ' ')}"
    try:
        number = int(epoch)
    except ValueError:
        raise ValueError(
            f"`{option}={epoch}`: give last, best:<key> (e.g. best:accuracy) or an epoch number."
        ) from None
    for name, run in zip(names, runs):
        if number not in run:
            raise ValueError(
                f"`{option}={epoch}`: run {name} has no validation at epoch {number} (it has {_spans(list(run))})."
            )
    return number, "as asked"


# ------------------------------------------------------------------------------------------------------ series
def series(summary: Mapping[str, Any], quantity: str) -> tuple[list[Any], list[float]]:
    """``(x, y)`` of one quantity of one summary: per layer, per ε, or per threshold τ (NaN for a missing value)."""

    def number(value: Any) -> float:
        return math.nan if value is None else float(value)

    layers = list(summary.get("layers") or [])
    if quantity in ("cos", "cka"):
        matrix = summary.get(quantity)
        return (layers, [number(row[-1]) for row in matrix]) if matrix else ([], [])
    if quantity in PER_LAYER:
        values = summary.get(quantity)
        return (layers, [number(value) for value in values]) if values else ([], [])
    if quantity == "effective_depth":
        depth = summary.get("effective_depth") or {}
        order = sorted(depth, key=float)
        missed = unreached(summary)
        return [float(eps) for eps in order], [math.nan if eps in missed else number(depth[eps]) for eps in order]
    if quantity in ("early_exit_accuracy", "early_exit_speedup"):
        rows = summary.get("early_exit") or []
        field = quantity.rsplit("_", 1)[1]
        return [float(row["threshold"]) for row in rows], [number(row.get(field)) for row in rows]
    raise KeyError(quantity)


def unreached(summary: Mapping[str, Any]) -> set[str]:
    """The ε (as the summary's keys) at which no layer reached accuracy ``1 − ε`` (``effective_depth_reached``).

    A summary written before that flag existed says nothing: every depth counts as reached.
    """
    flags = summary.get("effective_depth_reached") or {}
    return {eps for eps, reached in flags.items() if reached is False}


def _range(quantity: str, summaries: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    if quantity == "effective_depth":
        layers = [layer for summary in summaries for layer in summary.get("layers") or []]
        return (float(min(layers)), float(max(layers))) if layers else (-math.inf, math.inf)
    return RANGES.get(quantity, (-math.inf, math.inf))


def comparison_rows(
    groups: Sequence[Group], summaries: Sequence[Mapping[str, Any]], confidence: float = 0.95
) -> list[Row]:
    """Every quantity's rows: for each group and point, the mean and t-interval over its runs' ``summaries``.

    A point some run lacks counts as NaN for that run; a quantity no run has is left out.
    """
    rows: list[Row] = []
    for quantity in QUANTITIES:
        drawn = [series(summary, quantity) for summary in summaries]
        points = list(dict.fromkeys(x for xs, _ in drawn for x in xs))
        if not points:
            continue
        lower, upper = _range(quantity, summaries)
        for group in groups:
            for point in points:
                values = []
                for index in group.members:
                    xs, ys = drawn[index]
                    values.append(ys[xs.index(point)] if point in xs else math.nan)
                missed = 0
                if quantity == "effective_depth":
                    missed = sum(
                        any(float(eps) == point for eps in unreached(summaries[index])) for index in group.members
                    )
                mean, half, _ = t_interval(values, confidence)
                if missed:  # a mean over the runs that reached it would hide the others: no value
                    mean, half = math.nan, math.nan
                rows.append(
                    Row(
                        quantity,
                        group.label,
                        len(group.members),
                        point,
                        mean,
                        half,
                        tuple(values),
                        lower,
                        upper,
                        missed,
                    )
                )
    return rows


def layer_counts(summaries: Sequence[Mapping[str, Any]]) -> list[int]:
    """Each summary's number of layers."""
    return [len(summary.get("layers") or []) for summary in summaries]


# ------------------------------------------------------------------------------------------------------ table
CSV_FIELDS = ("quantity", "group", "seeds", "x", "mean", "half_width", "low", "high", "values", "not_reached")


def _plain(value: float) -> str:
    return "" if not math.isfinite(value) else repr(float(value))


def csv_rows(rows: Sequence[Row]) -> list[dict[str, str]]:
    """The table's rows as CSV fields, numbers at full precision (``values``: each run's, separated by spaces)."""
    return [
        {
            "quantity": row.quantity,
            "group": row.group,
            "seeds": str(row.seeds),
            "x": f"{row.x:g}" if isinstance(row.x, float) else str(row.x),
            "mean": _plain(row.mean),
            "half_width": _plain(row.half_width),
            "low": _plain(row.low),
            "high": _plain(row.high),
            "values": " ".join(_plain(value) or "nan" for value in row.values),
            "not_reached": str(row.unreached),
        }
        for row in rows
    ]


def decimals(mean: float, half: float) -> int:
    """The decimals a mean and its interval's half-width support: the half-width's two significant digits.

    Without an interval (one run), the mean's three significant digits; a whole number with no spread, none.
    """
    if math.isfinite(half) and half > 0:
        return max(0, 1 - math.floor(math.log10(half)))
    if float(mean).is_integer():
        return 0
    return max(0, 2 - math.floor(math.log10(abs(mean)))) if mean else 2


def cell(row: Row) -> str:
    """A row's ``mean ± half-width`` in the digits the interval supports (:func:`decimals`), accuracies in %."""
    if row.unreached:
        return "not reached" if row.unreached >= row.seeds else f"not reached in {row.unreached} of {row.seeds} runs"
    if not math.isfinite(row.mean):
        return "n/a"
    scale = 100.0 if row.quantity in PERCENT else 1.0
    mean, half = row.mean * scale, row.half_width * scale
    places = decimals(mean, half)
    if math.isfinite(half):
        return f"{mean:.{places}f} ± {half:.{places}f}"
    return f"{mean:.{places}f}"


def markdown(rows: Sequence[Row], heading: str) -> str:
    """One Markdown table per quantity: a row per point, a column per group, ``mean ± half-width`` (:func:`cell`)."""
    lines = [f"# {heading}", ""]
    for quantity in dict.fromkeys(row.quantity for row in rows):
        of = [row for row in rows if row.quantity == quantity]
        groups = list(dict.fromkeys(row.group for row in of))
        seeds = {row.group: row.seeds for row in of}
        points = list(dict.fromkeys(row.x for row in of))
        x_name = POSITIONS.get(quantity, "layer")
        unit = " (%)" if quantity in PERCENT else ""
        lines += [f"## {QUANTITIES[quantity]}{unit}", ""]
        lines.append("| " + " | ".join([x_name, *(f"{g} (n={seeds[g]})" for g in groups)]) + " |")
        lines.append("|" + " --- |" * (len(groups) + 1))
        for point in points:
            cells = [cell(next(r for r in of if r.group == group and r.x == point)) for group in groups]
            shown = f"{point:g}" if isinstance(point, float) else str(point)
            lines.append("| " + " | ".join([shown, *cells]) + " |")
        lines.append("")
    return "\n".join(lines)
