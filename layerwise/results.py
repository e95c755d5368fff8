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
    figure functions to its :data:`FIGURE_FUNCTIONS` (``layerwise.figures.registry``: what draws it). A file left
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
    functions = {**summary.get(FIGURE_FUNCTIONS, {}), **updates.get(FIGURE_FUNCTIONS, {})}
    summary.update(to_json(updates))
    if functions:  # every callback's figure functions, not the last one's
        summary[FIGURE_FUNCTIONS] = functions
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
    """Read one summary file; a ValueError naming the file when it is not a summary JSON object."""
    path = Path(path)
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a readable layerwise summary ({error}).") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{path} is not a layerwise summary (a JSON {type(summary).__name__}, not an object).")
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
            config = yaml.safe_load(path.read_text(encoding="utf-8"))
            return config if isinstance(config, dict) else None
    return None
