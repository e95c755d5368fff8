"""The results format: what the callbacks write and what ``plot``, ``export`` and ``sweep`` read.

- ``<log_dir>/layerwise/<stage>_epoch_<EEE>_step_<SSSSSSS>.json``: one summary per analysed validation (keys in
  :data:`REQUIRED_KEYS`).
- :func:`write_atomic`: the one way layerwise writes a file, so that a crash or a full disk never leaves half a file
  (its error: :class:`WriteError`, one line naming the path and the cause).
"""

import glob
import json
import math
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Optional, Union

from layerwise import __version__
from layerwise.errors import LayerwiseWarning, UsageError

# A summary's record of the functions that draw it: {"module:qualname": the key each reads, or None for the whole
# summary}, filled by every analysis callback that writes into it (layerwise.figures.registry).
FIGURE_FUNCTIONS = "figure_functions"
# A summary's record of the per-layer analyses that wrote it: {name: {"class", "options", "columns"}}, filled by
# every LayerwiseAnalysis of the run (its analyses' class and options; their per-layer results the report shows).
ANALYSES = "analyses"

REQUIRED_KEYS = (
    "epoch",
    "global_step",
    "num_samples",
    "layers",
    "cos",
    "cka",
    "accuracy",
    "loss",
    "saturation_counts",
    "saturation_cos",
    "nc1",
    "effective_depth",
    "early_exit",
    "n_nonfinite",
)


class WriteError(OSError):
    """A file (or folder) layerwise writes could not be written: one line naming the path and the cause.

    Raised by :func:`write_atomic` and :func:`write_folder_atomic` for any ``OSError`` of the writing (a full disk:
    ``ENOSPC``, a folder that vanished: ``ENOENT``, no permission); ``errno`` is the cause's. Nothing is left under
    the final name: the earlier file (if any) is still there, whole.
    """

    def __init__(self, path: Union[str, Path], cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.path = Path(path)

    def __str__(self) -> str:
        return f"could not write {self.path}: {self.strerror}."


def write_atomic(path: Union[str, Path], write: Callable[[IO[bytes]], Any]) -> Path:
    """Write a file through ``write(binary_file)`` into a temporary file beside ``path``, then rename it into place.

    Readers see the old file or the whole new one, never a part. The file gets the permissions ``open`` would give
    (0666 less the umask, usually 0644); the temporary file is removed on any error, ``KeyboardInterrupt`` included.
    An ``OSError`` (a full disk, the folder removed meanwhile) is raised as a :class:`WriteError` naming ``path``.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise WriteError(path, error) from error
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException as error:
        if os.path.exists(temporary):
            os.unlink(temporary)
        if isinstance(error, OSError) and not isinstance(error, WriteError):
            raise WriteError(path, error) from error
        raise
    return path


def write_folder_atomic(folder: Union[str, Path], write: Callable[[Path], Any], keep_existing: bool = False) -> Path:
    """Fill a folder through ``write(staging_folder)`` in a temporary sibling of ``folder``, then rename it into place.

    Readers see the old folder or the whole new one, never a part; the staging folder is removed on any error.
    An existing ``folder`` is replaced (moved aside, then removed), or, with ``keep_existing``, kept: another process
    that wrote the same folder first (every rank training one tokenizer) wins, and this one's copy is dropped.
    An ``OSError`` is raised as a :class:`WriteError` naming ``folder``.
    """
    folder = Path(folder)
    try:
        return _write_folder_atomic(folder, write, keep_existing)
    except WriteError:
        raise
    except OSError as error:
        raise WriteError(folder, error) from error


def _write_folder_atomic(folder: Path, write: Callable[[Path], Any], keep_existing: bool) -> Path:
    """:func:`write_folder_atomic`, its errors as they come."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    staging, previous = root / folder.name, root / "previous"  # staging does not exist yet: ``write`` makes it
    try:
        write(staging)
        if keep_existing:
            try:
                os.rename(staging, folder)
            except OSError:
                if not folder.is_dir():  # a real failure, not another process renaming the same folder first
                    raise
            return folder
        if folder.exists():
            os.replace(folder, previous)
        os.replace(staging, folder)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return folder


def write_text_atomic(path: Union[str, Path], text: str) -> Path:
    """:func:`write_atomic` for UTF-8 text."""
    return write_atomic(path, lambda file: file.write(text.encode("utf-8")))


def check_outputs_free(out: Union[str, Path], names: Sequence[str], overwrite: bool, flag: str = "--out") -> None:
    """Refuse, before any work starts, to write over the results of an earlier run in the folder ``out``.

    ``names`` are the files the command writes into ``out``; one that exists already stops the command with one line
    naming it, ``flag`` and ``--overwrite true`` (with which the files are replaced, each atomically).
    """
    taken = [name for name in names if (Path(out) / name).exists()]
    if taken and not overwrite:
        raise UsageError(
            f"`{flag}={out}` already holds {', '.join(taken)} from an earlier run: give another {flag}, or "
            "--overwrite true to replace it."
        )


def check_output_free(path: Union[str, Path], overwrite: bool, flag: str = "--out") -> None:
    """:func:`check_outputs_free` for a command whose ``flag`` names the file itself."""
    if Path(path).exists() and not overwrite:
        raise UsageError(
            f"`{flag}={path}` already exists, from an earlier run: give another {flag}, or --overwrite true to "
            "replace it."
        )


def save_figure_atomic(
    path: Union[str, Path], figure: Any, dpi: int = 150, metadata: Optional[Mapping[str, str]] = None
) -> Path:
    """:func:`write_atomic` for a matplotlib figure, in the format of the path's suffix (``metadata``: savefig's)."""
    fmt = Path(path).suffix[1:]
    extra = {"metadata": dict(metadata)} if metadata else {}
    return write_atomic(path, lambda file: figure.savefig(file, format=fmt, dpi=dpi, **extra))


def save_figures(
    figures: Mapping[str, Any],
    out: Path,
    stem: str,
    formats: Sequence[str],
    dpi: int = 150,
    metadata: Optional[Callable[[Any, str], Mapping[str, str]]] = None,
) -> list[Path]:
    """Every figure as ``out/<stem>_<name>.<format>`` in each of ``formats``, each closed once written (or failed).

    ``dpi``: the raster formats' resolution; ``metadata(figure, format)``: what each file records of itself.
    Returns the written paths, figure by figure.
    """
    import matplotlib.pyplot as plt  # here: reading results needs no matplotlib

    written = []
    for name, figure in figures.items():
        try:
            for fmt in formats:
                meta = metadata(figure, fmt) if metadata is not None else None
                written.append(save_figure_atomic(out / f"{stem}_{name}.{fmt}", figure, dpi, meta))
        finally:
            plt.close(figure)
    return written


def summary_path(log_dir: str, stage: str, epoch: int, step: int) -> Path:
    """Where the summary of ``stage`` (``val``/``test``) at ``epoch`` and global ``step`` lives.

    Keyed by the step too, so that several validations in one epoch (``val_check_interval``) each keep their file.
    """
    return Path(log_dir) / "layerwise" / f"{stage}_epoch_{epoch:03d}_step_{step:07d}.json"


_SUMMARY_NAME = re.compile(r"^[a-z][a-z0-9_]*_epoch_(\d+)(?:_step_(\d+))?\.json$")


def loader_stages(stage: str, loaders: Any) -> list[str]:
    """The name each evaluation dataloader's results are reported under, in dataloader order.

    The first dataloader is ``stage`` itself (``val``: what checkpoints and early stopping monitor); every other one
    is ``<stage>_<name>``, its key when the dataloaders are a dict (lower-cased, other characters than a-z and 0-9
    replaced by ``_``: ``"CIFAR-10.2"`` -> ``val_cifar_10_2``), else its index (``val_1``).
    """
    if isinstance(loaders, Mapping):
        names = [str(name) for name in loaders]
    elif isinstance(loaders, (list, tuple)):
        names = [str(index) for index in range(len(loaders))]
    else:
        return [stage]
    slugs = [re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or str(index) for index, name in enumerate(names)]
    stages = [stage] + [f"{stage}_{slug}" for slug in slugs[1:]]
    if len(set(stages)) != len(stages):
        raise ValueError(f"Evaluation dataloaders {names} give the same result name twice ({stages}): rename them.")
    return stages


def evaluated_split(datamodule: Any, stage: str) -> str:
    """The data split behind a summary's ``stage`` (its ``split``): ``validation``, ``test``, or a named set.

    ``test`` is the datamodule's ``test_split`` when it names another split (``ImageDataModule``: ``validation``,
    digits, CIFAR and ImageNet have no separate test split); ``val_corrupted`` is ``corrupted``.
    """
    if stage == "val":
        return "validation"
    if stage == "test":
        return str(getattr(datamodule, "test_split", None) or "test")
    return stage.split("_", 1)[1] if "_" in stage else stage


def is_summary(path: Path) -> bool:
    """Whether ``path`` is named like a summary (not saved features, not a file moved aside)."""
    return path.parent.name == "layerwise" and _SUMMARY_NAME.match(path.name) is not None


def summary_order(path: Path) -> tuple[int, int]:
    """``(epoch, step)`` of a summary file name, for reading summaries in the order they were written."""
    match = _SUMMARY_NAME.match(path.name)
    if match is None:
        return (-1, -1)
    return int(match.group(1)), int(match.group(2) or -1)


def to_json(value: Any) -> Any:
    """Tensors/arrays to nested lists, NaN/inf to ``null``."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict):
        return {str(key): to_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def merge_summary(path: Path, updates: dict[str, Any], run_id: str) -> None:
    """Add ``updates`` to the summary at ``path`` (written atomically).

    Several callbacks of one run (same ``run_id``) each contribute their keys to the same epoch's summary, and their
    figure functions to its :data:`FIGURE_FUNCTIONS` (``layerwise.figures.registry``: what draws it) and their
    analyses to its :data:`ANALYSES`. A file left
    by another run (an earlier run into the same folder: no logger, or W&B/MLflow first, do not version the runs) is
    moved aside as ``<name>.earlier-<time>``, with a warning once per run, and a new summary is written: never merged
    (no stale key survives), never lost.
    """
    summary = _readable_summary(path) if path.exists() else {}
    if summary and summary.get("run_id") != run_id:
        keep_earlier(path, "summary", warn=run_id not in _WARNED_EARLIER)
        _WARNED_EARLIER.add(run_id)
        summary = {}
    summary = {"run_id": run_id, "layerwise_version": __version__, **summary}  # which layerwise wrote it
    merged = {key: {**summary.get(key, {}), **updates.get(key, {})} for key in (FIGURE_FUNCTIONS, ANALYSES)}
    summary.update(to_json(updates))
    for key, records in merged.items():  # every callback's figure functions and analyses, not the last one's
        if records:
            summary[key] = records
    write_text_atomic(path, json.dumps(summary, indent=1, allow_nan=False))


_WARNED_EARLIER: set[str] = set()  # runs already told that their folder held an earlier run's summaries


def keep_earlier(path: Path, what: str, warn: bool = True) -> None:
    """Move an earlier run's ``path`` (its ``what``: summary, config) aside as ``<name>.earlier-<time>``, and say so."""
    aside = move_aside(path, "earlier")
    if warn:
        warnings.warn(
            f"layerwise: {path} held the {what} of an earlier run; moved it to {aside.name}. Give each run its own "
            "folder: a TensorBoardLogger or CSVLogger first versions them.",
            LayerwiseWarning,
            stacklevel=3,
        )


def move_aside(path: Path, reason: str) -> Path:
    """Move ``path`` to ``<name>.<reason>-<time>`` (``_2``, ``_3``, ... when taken) and return where it went."""
    stem = f"{path.name}.{reason}-{time.strftime('%Y%m%d-%H%M%S')}"
    aside, number = path.with_name(stem), 1
    while aside.exists():
        number += 1
        aside = path.with_name(f"{stem}_{number}")
    os.replace(path, aside)
    return aside


def _readable_summary(path: Path) -> dict[str, Any]:
    """The summary at ``path``, or ``{}`` after moving a corrupt or foreign file aside (with a warning)."""
    try:
        return load_summary(path)
    except ValueError as error:
        aside = move_aside(path, "corrupt")
        warnings.warn(f"{error} Moved it to {aside.name} and wrote a new summary.", LayerwiseWarning, stacklevel=3)
        return {}


def load_summary(path: Union[str, Path]) -> dict[str, Any]:
    """Read one summary file through the one schema (:func:`check_summary`): what every reader of a summary calls.

    A file that is not a summary, or does not fit it, is a :class:`SummaryError` (a ``UsageError``): one line naming
    the file, the key and what was expected. ``NaN``/``Infinity`` literals and numbers beyond a float's range are
    read as ``null`` (not finite), as the writer writes them.
    """
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_SUMMARY_BYTES:
        raise SummaryError(
            f"{path}: {size} bytes, more than a summary holds ({MAX_SUMMARY_BYTES >> 20} MiB); not read."
        )
    try:
        summary = json.loads(
            path.read_bytes().decode("utf-8"), parse_constant=_not_finite, parse_float=_finite_float, parse_int=_integer
        )
    except ValueError as error:  # not JSON, not UTF-8
        raise SummaryError(f"{path} is not a readable layerwise summary ({str(error)[:200]}).") from None
    except RecursionError:
        raise SummaryError(f"{path} is not a layerwise summary: its JSON is nested too deeply to read.") from None
    return check_summary(summary, path)


# ------------------------------------------------------------------------------- the one schema of a summary
def _not_finite(_: str) -> None:
    """``NaN``, ``Infinity``, ``-Infinity`` in a summary: undefined, as the writer writes them (``null``)."""
    return None


def _integer(text: str) -> Optional[Union[int, float]]:
    """A JSON integer; one of 19 digits or more is a float (``null`` beyond a float's range), never a huge int."""
    return int(text) if len(text) < 19 else _finite_float(text)


def _finite_float(text: str) -> Optional[float]:
    """A JSON number; one beyond a float's range (``1e999``) is not finite: ``null``."""
    value = float(text)
    return value if math.isfinite(value) else None


MAX_SUMMARY_BYTES = 256 << 20  # a 4096-layer model's L x L matrices fit many times over
MAX_LAYERS = 4096  # per-layer rows: more than any model's depth
MAX_ROWS = 100_000  # any other list of a summary (thresholds, quantile levels, bins)
MAX_NESTING = 32  # the package writes at most 5 levels (residual_norm_ratio.quantiles); a user's analysis, more


Check = Callable[[str, Any, dict[str, Any]], Any]  # (where, value, the object holding it): raises _Mismatch


class SummaryError(UsageError):
    """A summary file that does not fit the schema: one line naming the file, the key and what was expected."""


class _Mismatch(Exception):
    def __init__(self, where: str, expected: str, value: Any = None, shown: bool = True) -> None:
        super().__init__(where)
        self.where, self.expected, self.value, self.shown = where, expected, value, shown


def _kind(value: Any) -> str:
    """A JSON value in words, never the value itself (a file's text may be anything)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(where: str, value: Any, nullable: bool = True, integer: bool = False, minimum: Optional[float] = None):
    if value is None and nullable:
        return
    if integer and (isinstance(value, float) and value.is_integer()):
        value = int(value)
    ok = isinstance(value, int) and not isinstance(value, bool) if integer else _is_number(value)
    if not ok or (minimum is not None and value < minimum):
        what = "an integer" if integer else "a number"
        what += f" >= {minimum:g}" if minimum is not None else ""
        raise _Mismatch(where, what + (" or null" if nullable else ""), value)


def _string(where: str, value: Any, nullable: bool = False) -> None:
    if not (isinstance(value, str) or (nullable and value is None)):
        raise _Mismatch(where, "a string" + (" or null" if nullable else ""), value)


def _grid(
    where: str, value: Any, shape: Sequence[Optional[int]], integer: bool = False, nullable: bool = True
) -> tuple[int, ...]:
    """Nested lists of numbers (or null) of ``shape`` (None: any length, the same in every row); the shape found."""
    if not shape:
        _number(where, value, nullable=nullable, integer=integer)
        return ()
    length, limit = shape[0], MAX_LAYERS if len(shape) > 1 else MAX_ROWS
    if not isinstance(value, list) or (length is not None and len(value) != length) or len(value) > limit:
        size = f"{length}" if length is not None else f"at most {limit}"
        dims = " x ".join("n" if n is None else str(n) for n in shape)
        raise _Mismatch(where, f"a list of {size} ({dims} {'integers' if integer else 'numbers'})", value)
    inner: Optional[tuple[int, ...]] = None
    for index, item in enumerate(value):
        found = _grid(f"{where}[{index}]", item, inner or shape[1:], integer, nullable)
        inner = inner or found
    return (len(value), *(inner or tuple(n or 0 for n in shape[1:])))


def _layers_of(summary: dict[str, Any]) -> int:
    if "layers" not in summary or summary["layers"] is None:
        raise _Mismatch("layers", "the layer numbers (a list of integers) beside the per-layer keys", shown=False)
    return len(summary["layers"])


def _per_layer(*dims: Optional[int], integer: bool = False) -> Check:
    """A per-layer key: L rows (L = the length of ``layers``), each of ``dims`` (-1: L again)."""

    def check(where: str, value: Any, summary: dict[str, Any]) -> None:
        if value is not None:
            size = _layers_of(summary)
            _grid(where, value, [size, *(size if dim == -1 else dim for dim in dims)], integer=integer)

    return check


def _scalar(integer: bool = False, nullable: bool = True, minimum: Optional[float] = None) -> Check:
    return lambda where, value, summary: _number(where, value, nullable, integer, minimum)


def _text(nullable: bool = False) -> Check:
    return lambda where, value, summary: _string(where, value, nullable)


def _numbers(integer: bool = False) -> Check:
    return lambda where, value, summary: None if value is None else _grid(where, value, [None], integer=integer)


def _strings(where: str, value: Any, summary: dict[str, Any]) -> None:
    if not isinstance(value, list) or len(value) > MAX_ROWS:
        raise _Mismatch(where, "a list of names", value)
    for index, item in enumerate(value):
        _string(f"{where}[{index}]", item)


def _layers(where: str, value: Any, summary: dict[str, Any]) -> None:
    if not isinstance(value, list) or len(value) > MAX_LAYERS:
        raise _Mismatch(where, f"a list of at most {MAX_LAYERS} layer numbers", value)
    for index, item in enumerate(value):
        _number(f"{where}[{index}]", item, nullable=False, integer=True, minimum=0)


def _figure_functions(where: str, value: Any, summary: dict[str, Any]) -> None:
    if not isinstance(value, dict):
        raise _Mismatch(where, 'an object {"module:function": the key it reads, or null}', value)
    for name, key in value.items():
        _string(f"{where}[{name[:40]!r}]", key, nullable=True)


def _epsilon_keys(where: str, value: Any, expected: str) -> dict[str, Any]:
    """An object keyed by ε (``"0.05"``), at most :data:`MAX_ROWS` entries; ``expected`` says what it holds."""
    if not isinstance(value, dict) or len(value) > MAX_ROWS:
        raise _Mismatch(where, expected, value)
    for epsilon in value:
        try:
            float(epsilon)
        except ValueError:
            raise _Mismatch(where, 'ε keys that are numbers ("0.05")', shown=False) from None
    return value


def _effective_depth(where: str, value: Any, summary: dict[str, Any]) -> None:
    if value is not None:
        for epsilon, depth in _epsilon_keys(where, value, 'an object {"ε": layer number or null}').items():
            _number(f"{where}[{epsilon!r}]", depth, integer=True)


def _effective_depth_reached(where: str, value: Any, summary: dict[str, Any]) -> None:
    if value is not None:
        for epsilon, reached in _epsilon_keys(where, value, 'an object {"ε": true/false}').items():
            if not isinstance(reached, bool):
                raise _Mismatch(f"{where}[{epsilon[:40]!r}]", "true or false", reached)


def _early_exit(where: str, value: Any, summary: dict[str, Any]) -> None:
    if value is None:
        return
    if not isinstance(value, list) or len(value) > MAX_ROWS:
        raise _Mismatch(where, "a list of thresholds' rows", value)
    width: Optional[int] = None
    for index, row in enumerate(value):
        at = f"{where}[{index}]"
        if not isinstance(row, dict):
            raise _Mismatch(at, "an object with threshold, accuracy, speedup and exit_counts", row)
        _number(f"{at}.threshold", row.get("threshold"), nullable=False)
        for field in ("accuracy", "speedup"):
            _number(f"{at}.{field}", row.get(field))
        width = _grid(f"{at}.exit_counts", row.get("exit_counts"), [width])[0]


def _object(fields: dict[str, Check], sizes: Callable[[str, dict[str, Any]], None]) -> Check:
    """A results object (``coupling``, ``compare``, ...): each field's check, then how their sizes agree."""

    def check(where: str, value: Any, summary: dict[str, Any]) -> None:
        if value is None:
            return
        if not isinstance(value, dict):
            raise _Mismatch(where, f"an object with {', '.join(fields)}", value)
        for field, field_check in fields.items():
            if field not in value:
                raise _Mismatch(f"{where}.{field}", "present", shown=False)
            field_check(f"{where}.{field}", value[field], value)
        sizes(where, value)

    return check


def _grid_check(*shape: Optional[int]) -> Check:
    return lambda where, value, summary: _grid(where, value, list(shape))


def _coupling_sizes(where: str, value: dict[str, Any]) -> None:
    ks = len(value["ks"])
    _grid(f"{where}.depth_coupling", value["depth_coupling"], [ks, None, None])
    _grid(f"{where}.coupling_score", value["coupling_score"], [ks])
    _grid(f"{where}.inverse_sigma_1", value["inverse_sigma_1"], [len(value["sigma"])])


def _compare_sizes(where: str, value: dict[str, Any]) -> None:
    layers_a, layers_b = len(value["layers_a"]), len(value["layers_b"])
    _grid(f"{where}.cka", value["cka"], [layers_a, layers_b])
    measures = value.get(
        "measures"
    )  # CrossModelComparison(measures=...): L_A x L_B each, the effective ranks per layer
    if measures is None:
        return
    if not isinstance(measures, dict):
        raise _Mismatch(f"{where}.measures", "an object of L_A x L_B grids", measures)
    for name, grid in measures.items():
        sides = {"effective_rank_a": [layers_a], "effective_rank_b": [layers_b]}
        _grid(f"{where}.measures.{name}", grid, sides.get(name, [layers_a, layers_b]))


def _residual_sizes(where: str, value: dict[str, Any]) -> None:
    branches, layers, levels = (len(value[key]) for key in ("branches", "layers", "quantile_levels"))
    _grid(f"{where}.mean", value["mean"], [branches, layers])
    _grid(f"{where}.quantiles", value["quantiles"], [branches, layers, levels])
    if not {0.25, 0.5, 0.75} <= {round(float(level), 6) for level in value["quantile_levels"]}:
        raise _Mismatch(f"{where}.quantile_levels", "the levels 0.25, 0.5 and 0.75 among them", shown=False)


def _cos_quantiles(where: str, value: Any, summary: dict[str, Any]) -> None:
    if value is None:
        return
    for needed in ("cos_quantile_levels", "cos_negative_fraction"):
        if summary.get(needed) is None:
            raise _Mismatch(needed, f"present beside {where}", shown=False)
    _per_layer(-1, len(summary["cos_quantile_levels"]))(where, value, summary)


def _levels(where: str, value: Any, summary: dict[str, Any]) -> None:
    if value is not None:
        _grid(where, value, [None], nullable=False)
        for index, level in enumerate(value):
            if not 0.0 <= level <= 1.0:
                raise _Mismatch(f"{where}[{index}]", "a level in [0, 1]", level)


# What each key of a summary holds (docs/json-format.md); a key not here (a user's analysis) may hold any JSON.
SUMMARY_SCHEMA: dict[str, Check] = {
    "run_id": _text(),
    "layerwise_version": _text(),
    FIGURE_FUNCTIONS: _figure_functions,
    "stage": _text(),
    "split": _text(),
    "epoch": _scalar(integer=True, nullable=False, minimum=0),
    "global_step": _scalar(integer=True, nullable=False, minimum=0),
    "num_samples": _scalar(integer=True, minimum=0),
    "depth": _scalar(integer=True, minimum=0),
    "n_nonfinite": _scalar(integer=True, minimum=0),
    "layers": _layers,
    **{key: _per_layer(-1) for key in ("cos", "cka", "cos_negative_fraction")},
    **{key: _per_layer(-1) for key in ("debiased_cka", "cca", "svcca", "pwcca", "procrustes", "shape")},
    **{key: _per_layer(-1) for key in ("mutual_knn", "cknna")},
    "effective_rank": _per_layer(),
    "cos_quantile_levels": _levels,
    "cos_quantiles": _cos_quantiles,
    "cos_histogram_to_last": _per_layer(None),
    **{
        key: _per_layer()
        for key in ("accuracy", "loss", "saturation_counts", "saturation_cos", "nc1", "perplexity", "f1")
        + ("exit_accuracy", "exit_loss")
        + ("cdnv", "nc2_equinorm", "nc2_cos_std", "nc2_equiangular", "nc2_etf", "nc3", "nc3_duality")
        + ("nc4_agreement", "nc4_ncc_accuracy")
        + ("kl_to_final", "entropy", "final_rank")  # the logit lens's divergence (or a tuned lens's)
    },
    "nc1_classes": _numbers(integer=True),
    "effective_depth": _effective_depth,
    "effective_depth_reached": _effective_depth_reached,
    "effective_depth_relative": _effective_depth,
    "early_exit": _early_exit,
    "exit_early_exit": _early_exit,
    **{key: _scalar() for key in ("trajectory_lss", "trajectory_expodistance", "trajectory_step_variation")},
    "trajectory_step_norm": _numbers(),
    "trajectory_step_ratio": _numbers(),
    "detection_ap50": _numbers(),
    "coupling": _object(
        {
            "num_prompts": _scalar(integer=True),
            "ks": _numbers(integer=True),
            "depth_coupling": _grid_check(None, None, None),
            "coupling_score": _numbers(),
            "sigma": _grid_check(None, None),
            "inverse_sigma_1": _numbers(),
            "trajectory_step_norm": _numbers(),
            "trajectory_lss": _scalar(),
            "trajectory_expodistance": _scalar(),
            "linearisation_cosine": _scalar(),
        },
        _coupling_sizes,
    ),
    "compare": _object(
        {"layers_a": _layers, "layers_b": _layers, "cka": _grid_check(None, None)},
        _compare_sizes,
    ),
    "residual_norm_ratio": _object(
        {
            "branches": _strings,
            "layers": _layers,
            "quantile_levels": _levels,
            "quantiles": _grid_check(None, None, None),
            "mean": _grid_check(None, None),
        },
        _residual_sizes,
    ),
}


def _version(text: str) -> tuple[int, ...]:
    """The release numbers of a version string (``"0.2.0.dev1"`` -> ``(0, 2, 0)``); ``()`` when it has none."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", text)
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


def _nesting(value: Any) -> int:
    """How deeply ``value``'s lists and objects nest (iteratively: a hostile file cannot exhaust the stack)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, level + 1)
            if deepest > MAX_NESTING:
                return deepest
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def check_summary(summary: Any, path: Union[str, Path] = "summary") -> dict[str, Any]:
    """``summary`` (a JSON value read from ``path``) when it fits the results format, else a :class:`SummaryError`.

    Every key the package writes is checked for its type and its shape (the per-layer rows against ``layers``, the
    objects' fields against each other; docs/json-format.md), so that no figure meets a value it cannot draw; a key
    of a user's analysis may hold any JSON, nested at most :data:`MAX_NESTING` deep. A summary written by a newer
    layerwise than this one is read, with a warning, as far as this version knows its keys; its errors say so.
    """
    if not isinstance(summary, dict):
        raise SummaryError(f"{path} is not a layerwise summary (its JSON is {_kind(summary)}, not an object).")
    written = summary.get("layerwise_version")
    written = written if isinstance(written, str) else ""
    newer = bool(written) and _version(written) > _version(__version__)
    note = f" (written by layerwise {written[:40]}, newer than this {__version__}: upgrade layerwise)" if newer else ""
    try:
        for key, check in SUMMARY_SCHEMA.items():
            if key in summary:
                check(key, summary[key], summary)
    except _Mismatch as mismatch:
        got = f", not {_kind(mismatch.value)}" if mismatch.shown else ""
        raise SummaryError(f"{path}: `{mismatch.where}` must be {mismatch.expected}{got}{note}.") from None
    if _nesting(summary) > MAX_NESTING:
        deep = next(key for key, value in summary.items() if _nesting(value) >= MAX_NESTING)
        raise SummaryError(f"{path}: `{deep}` nests lists or objects more than {MAX_NESTING} deep{note}.")
    if newer:
        warnings.warn(
            f"layerwise: {path} was written by layerwise {written[:40]}, newer than this {__version__}: "
            "drawn with the keys this version knows (upgrade layerwise for the rest).",
            LayerwiseWarning,
            stacklevel=3,
        )
    return summary


EVALUATION_FOLDER = re.compile(r"^(validate|test)_epoch_\d+_step_\d+(-v\d+)?$")
"""The sub-folder of a run where ``layerwise validate/test --ckpt_path <run>/checkpoints/…`` writes its results."""


def is_evaluation(folder: Path, found: list[Path]) -> bool:
    """Whether the log folder ``folder`` (``.../layerwise``) holds an evaluation of a checkpoint, not a fit.

    An evaluation's run folder is named like :data:`EVALUATION_FOLDER`; an older one (a ``version_N`` of its own)
    has summaries at step 0 only, as no fit writes them.
    """
    if EVALUATION_FOLDER.match(folder.parent.name):
        return True
    return all(summary_order(p)[1] == 0 for p in found if p.parent == folder)


def choose_run(found: list[Path]) -> Path:
    """The log folder (``.../layerwise``) a user means among several: the latest fit run.

    Latest: the run whose newest summary was written last (ties: the later folder name). Evaluations by ``validate``
    and ``test`` are not fit runs and are chosen only when there is nothing else; name their folder to draw them.
    """
    folders = sorted({p.parent for p in found})
    fits = [folder for folder in folders if not is_evaluation(folder, found)] or folders

    def written(folder: Path) -> tuple[float, list[tuple[int, str]]]:
        newest = max(p.stat().st_mtime for p in found if p.parent == folder)
        natural = [(int(part), "") if part.isdigit() else (-1, part) for part in re.split(r"(\d+)", str(folder))]
        return newest, natural

    return max(fits, key=written)


def find_summaries(path: Path, all_epochs: bool = False, stage: str = "*", option: str = "path") -> list[Path]:
    """The summary files named by ``path``: the file itself, or the latest (or every) one of each stage under it.

    Under a folder holding several runs, the run is :func:`choose_run`'s (say ``runs/x/version_N`` to pick one);
    the command prints which. Errors (``FileNotFoundError``) name ``option``.
    """
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{option} {path}: no such file or directory.")
    found = sorted((p for p in path.rglob(f"{stage}_epoch_*.json") if is_summary(p)), key=summary_order)
    if not found:
        raise FileNotFoundError(
            f"{option} {path}: no layerwise/{stage}_epoch_*.json under it; run `layerwise fit` or `layerwise "
            "validate` with the analysis callbacks first, or give the JSON file."
        )
    run = choose_run(found)
    found = [p for p in found if p.parent == run]
    if all_epochs:
        return found
    stages = sorted({p.name.split("_epoch_")[0] for p in found})
    return [max((p for p in found if p.name.startswith(f"{s}_epoch_")), key=summary_order) for s in stages]


def latest_summary(path: Path, option: str = "path", stage: str = "val") -> Path:
    """The summary JSON named by ``path``: the file itself, or the latest ``<stage>`` epoch of the latest log dir."""
    return find_summaries(path, stage=stage, option=option)[0]


# ------------------------------------------------------------------------------- several runs (plot/report RUN...)
def is_pattern(path: Union[str, Path]) -> bool:
    """Whether ``path`` is a glob to expand (``runs/modes/*``), not a file or folder that exists."""
    return not Path(path).exists() and re.search(r"[*?[]", str(path)) is not None


def find_runs(paths: Sequence[Union[str, Path]], option: str = "path") -> list[tuple[int, Path]]:
    """The run folders (each holding ``layerwise/``) that ``paths`` name, with the index of the path naming each.

    A path is a run folder, a folder of runs (its latest fit run, as :func:`find_summaries` chooses), a summary JSON
    (its run) or a glob (``runs/modes/*``: each match); a run named twice is taken once. Errors name ``option``.
    """
    found: dict[Path, int] = {}
    for index, given in enumerate(paths):
        given = Path(given)
        matches = [given]
        if is_pattern(given):
            matches = [Path(match) for match in sorted(glob.glob(str(given)))]
            if not matches:
                raise FileNotFoundError(f"{option} {given}: the pattern matches no file or folder.")
        for match in matches:
            summary = find_summaries(match, stage="val", option=option)[0]
            found.setdefault(summary.parent.parent.resolve(), index)
    return [(index, run) for run, index in found.items()]


def run_summaries(run: Path, stage: str = "val") -> dict[int, dict[str, Any]]:
    """Every ``stage`` summary of a run folder by epoch (the epoch's latest validation when it has several)."""
    files = sorted(
        (p for p in (Path(run) / "layerwise").glob(f"{stage}_epoch_*.json") if is_summary(p)), key=summary_order
    )
    by_epoch = {}
    for path in files:
        summary = load_summary(path)
        by_epoch[int(summary.get("epoch", summary_order(path)[0]))] = summary
    return by_epoch


def run_config(run: Path) -> Optional[dict[str, Any]]:
    """A run's config: LightningCLI's ``config.yaml``, else the module's ``hparams.yaml``; None when it has neither."""
    import yaml

    for name in ("config.yaml", "hparams.yaml"):
        path = Path(run) / name
        if path.is_file():
            try:
                config = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace"))
            except (yaml.YAMLError, RecursionError) as error:  # a config is read as data here, never built
                where = getattr(error, "problem_mark", None)
                at = f" (line {where.line + 1})" if where is not None else ""
                cause = str(getattr(error, "problem", "") or type(error).__name__)[:120]
                raise UsageError(f"{path} is not a readable YAML config{at}: {cause}.") from None
            return config if isinstance(config, dict) else None
    return None
