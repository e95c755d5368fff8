"""The shipped quickstart against the same fit without the analysis callbacks, quiet and on a busy machine (issue 36.8).

Runs ``layerwise fit --config configs/quickstart.yaml`` as shipped (the analysis callbacks, their figures' drawing
process, one intra-op thread) and the same config with the analysis callbacks removed (the two ModelCheckpoints stay),
each in a fresh folder, on a quiet machine and with as many CPU-bound processes beside them as the machine has cores
(a Python loop each, started before and stopped after each fit): "the main job steady on a machine that is not
idle". Records the wall times and the ratios, measured side by side in one run.

    .venv/bin/python benchmarks/quickstart_load.py                # the whole 40-epoch quickstart (~6 min on 2 cores)
    .venv/bin/python benchmarks/quickstart_load.py --epochs 5     # a smoke run
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _load import busy_processes, fit_seconds  # noqa: E402
from _record import load_now, record  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "quickstart.yaml"


def without_analysis(folder: Path) -> Path:
    """The quickstart config with every layerwise callback removed (Lightning's checkpoints kept)."""
    config = yaml.safe_load(CONFIG.read_text())
    callbacks = config["trainer"]["callbacks"]
    config["trainer"]["callbacks"] = [c for c in callbacks if not c["class_path"].startswith("layerwise.")]
    path = folder / "quickstart_without_analysis.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2
    load_before = load_now()
    seconds: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        plain = without_analysis(Path(folder))
        for load in (0, cores):
            with busy_processes(load):
                row = seconds.setdefault("quiet" if load == 0 else f"busy_{load}", {})
                row["shipped"] = round(fit_seconds(CONFIG, args.epochs), 1)
                row["without_analysis"] = round(fit_seconds(plain, args.epochs), 1)
                print(load, "busy:", row, flush=True)
    ratios = {load: round(row["shipped"] / row["without_analysis"], 2) for load, row in seconds.items()}
    values = {"epochs": args.epochs, "busy_processes": cores, "seconds": seconds, "ratio": ratios}
    record(f"quickstart_load_{args.epochs}_epochs", values, load_before)


if __name__ == "__main__":
    main()
