"""The full quickstart reaches its accuracy bound (its time bound is measured by benchmarks/quickstart.py)."""

import json
from pathlib import Path

import pytest

from layerwise.cli import main
from layerwise.results import is_summary, summary_order

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"


@pytest.mark.slow
def test_full_quickstart_reaches_95_percent_at_the_last_layer(tmp_path):
    main(
        [
            "fit",
            "--config",
            str(QUICKSTART),
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
        ]
    )
    folder = tmp_path / "quickstart" / "version_0" / "layerwise"
    summaries = sorted((p for p in folder.glob("val_epoch_*.json") if is_summary(p)), key=summary_order)
    assert len(summaries) == 40
    last = json.loads(summaries[-1].read_text())
    assert last["accuracy"][-1] >= 0.95
    assert last["num_samples"] == 360
