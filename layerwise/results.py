"""The results format: what the callbacks write and what ``plot``, ``export`` and ``sweep`` read.

- ``<log_dir>/layerwise/<stage>_epoch_<EEE>.json``: one summary per analysed epoch (keys in :data:`REQUIRED_KEYS`).
- :func:`write_atomic`: the one way layerwise writes a file, so that a crash never leaves half a file.
"""

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Union

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
)


def write_atomic(path: Union[str, Path], write: Callable[[IO[bytes]], Any]) -> Path:
    """Write a file through ``write(binary_file)`` into a temporary file beside ``path``, then rename it into place.

    Readers see the old file or the whole new one, never a part. The file gets the permissions ``open`` would give
    (0666 less the umask, usually 0644); the temporary file is removed on any error, ``KeyboardInterrupt`` included.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return path


def write_text_atomic(path: Union[str, Path], text: str) -> Path:
    """:func:`write_atomic` for UTF-8 text."""
    return write_atomic(path, lambda file: file.write(text.encode("utf-8")))


def save_figure_atomic(path: Union[str, Path], figure: Any, dpi: int = 150) -> Path:
    """:func:`write_atomic` for a matplotlib figure, in the format of the path's suffix."""
    return write_atomic(path, lambda file: figure.savefig(file, format=Path(path).suffix[1:], dpi=dpi))


def summary_path(log_dir: str, stage: str, epoch: int) -> Path:
    """Where the summary of ``stage`` (``val``/``test``) at ``epoch`` lives."""
    return Path(log_dir) / "layerwise" / f"{stage}_epoch_{epoch:03d}.json"


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

    Several callbacks of one run (same ``run_id``) each contribute their keys to the same epoch's summary; a file left
    by another run (e.g. an earlier run into the same folder) is replaced, not merged, so no stale key survives.
    """
    summary = json.loads(path.read_text()) if path.exists() else {}
    if summary.get("run_id") != run_id:
        summary = {"run_id": run_id}
    summary.update(to_json(updates))
    write_text_atomic(path, json.dumps(summary, indent=1, allow_nan=False))


def load_summary(path: Union[str, Path]) -> dict[str, Any]:
    """Read one summary file."""
    return json.loads(Path(path).read_text())


def find_summaries(path: Path, all_epochs: bool = False, stage: str = "*", option: str = "path") -> list[Path]:
    """The summary files named by ``path``: the file itself, or the latest (or every) one of each stage under it.

    "Latest" is the newest log folder holding summaries; errors (``FileNotFoundError``) name ``option``.
    """
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{option} {path}: no such file or directory.")
    found = sorted(p for p in path.rglob(f"{stage}_epoch_*.json") if p.parent.name == "layerwise")
    if not found:
        raise FileNotFoundError(
            f"{option} {path}: no layerwise/{stage}_epoch_*.json under it; run `layerwise fit` or `layerwise "
            "validate` with the analysis callbacks first, or give the JSON file."
        )
    if all_epochs:
        return found
    latest_dir = max({p.parent for p in found}, key=lambda folder: folder.stat().st_mtime)
    stages = sorted({p.name.split("_epoch_")[0] for p in found if p.parent == latest_dir})
    return [max(p for p in found if p.parent == latest_dir and p.name.startswith(f"{s}_epoch_")) for s in stages]


def latest_summary(path: Path, option: str = "path", stage: str = "val") -> Path:
    """The summary JSON named by ``path``: the file itself, or the latest ``<stage>`` epoch of the latest log dir."""
    return find_summaries(path, stage=stage, option=option)[0]
