"""The per-epoch JSON summary: ``<log_dir>/layerwise/<stage>_epoch_<EEE>.json``."""

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

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
    """Add ``updates`` to the summary at ``path`` (written atomically, so a crash never leaves half a file).

    Several callbacks of one run (same ``run_id``) each contribute their keys to the same epoch's summary; a file left
    by another run (e.g. an earlier run into the same folder) is replaced, not merged, so no stale key survives.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    summary = json.loads(path.read_text()) if path.exists() else {}
    if summary.get("run_id") != run_id:
        summary = {"run_id": run_id}
    summary.update(to_json(updates))
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(handle, "w") as file:
        json.dump(summary, file, indent=1, allow_nan=False)
    os.replace(temporary, path)


def load_summary(path: str) -> dict[str, Any]:
    """Read one summary file."""
    return json.loads(Path(path).read_text())
