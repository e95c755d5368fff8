"""The paper's comparison on the shipped quickstart: standard against aligned training, three seeds each, per layer.

Trains ``configs/quickstart.yaml`` (its ``AlternatingAligned`` mode, the "aligned" runs) and the same config with
``--model.class_path=layerwise.lightning_modules.Standard`` (last-layer cross-entropy, the "standard" runs) with
``seed_everything`` 0, 1 and 2 each (the validation split stays the config's: the same 360 digits for every run),
each fit as a user runs it (``python -m layerwise fit``, this interpreter, one process after another). Then draws
them side by side with ``layerwise plot RUN... --out <run-dir>/comparison`` (the seeds of each mode as their mean and
95 % t-interval, at the last epoch) and records the per-layer numbers of its table in
``benchmarks/recorded/training_modes.json``: the mean and half-width of every quantity per mode and layer, and the
gaps the Training modes page cites (aligned minus standard accuracy per layer, in points). The accuracy and COS
figures are copied to ``docs/figures/training_modes_accuracy.png`` and ``training_modes_cos.png``.

    python benchmarks/training_modes.py                          # 6 fits of 40 epochs (about 6 min on 2 quiet cores)
    python benchmarks/training_modes.py --epochs 10              # a shorter run; the record says how many epochs
    python benchmarks/training_modes.py --run-dir /tmp/tm --reuse   # keep the runs; skip fits already done

Exit status: 0 when every fit and the comparison succeeded, 2 otherwise.
"""

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import load_now, record  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "quickstart.yaml"
FIGURES = REPO / "docs" / "figures"
MODES = {"standard": ["--model.class_path=layerwise.lightning_modules.Standard"], "aligned": []}
SEEDS = (0, 1, 2)
# a group's label (the --label the script gives, or the class in words) -> the class name the record keeps
CLASSES = {"standard": "Standard", "aligned": "AlternatingAligned", "alternating aligned": "AlternatingAligned"}


def fitted(run: Path) -> bool:
    """A finished fit's run folder: its summaries and its last checkpoint are there."""
    return bool(list((run / "layerwise").glob("val_epoch_*.json"))) and (run / "checkpoints" / "last.ckpt").exists()


def run_fit(
    run_dir: Path, name: str, arguments: list[str], finished: Optional[Callable[[Path], bool]] = None
) -> tuple[Path, Optional[float]]:
    """``layerwise fit`` with ``arguments`` (``--config`` first) as run ``name`` under ``run_dir/runs``, its output in
    ``run_dir/<name>.log``: the run folder and wall seconds, or (folder, None) where ``finished`` says it is done."""
    run = run_dir / "runs" / name / "version_0"
    if finished is not None and finished(run):
        print(f"reusing {run}", flush=True)
        return run, None
    if run.parent.exists():
        shutil.rmtree(run.parent)
    command = [
        sys.executable,
        "-m",
        "layerwise",
        "fit",
        *arguments,
        f"--trainer.logger.init_args.save_dir={run_dir / 'runs'}",
        f"--trainer.logger.init_args.name={name}",
        "--trainer.enable_progress_bar=false",
    ]
    print("running:", " ".join(command), flush=True)
    log = run_dir / f"{name}.log"
    with log.open("w") as output:
        start = time.perf_counter()
        status = subprocess.call(command, cwd=run_dir, stdout=output, stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - start
    if status != 0:
        raise RuntimeError(f"the {name} fit exited with {status}:\n{log.read_text(errors='replace')[-3000:]}")
    print(f"{name}: {seconds:.1f} s", flush=True)
    return run, seconds


def fit(run_dir: Path, mode: str, seed: int, epochs: Optional[int], reuse: bool) -> tuple[Path, Optional[float]]:
    """One quickstart fit in ``mode`` with ``seed``: its run folder and wall seconds (None: reused)."""
    arguments = ["--config", str(CONFIG), f"--seed_everything={seed}", *MODES[mode]]
    if epochs is not None:
        arguments += [f"--trainer.max_epochs={epochs}", f"--model.init_args.lr_scheduler.init_args.max_epochs={epochs}"]
    return run_fit(run_dir, f"{mode}_seed{seed}", arguments, fitted if reuse else None)


def compare(runs: list[Path], out: Path, labels: Optional[list[str]] = None) -> list[dict[str, str]]:
    """``layerwise plot RUN... --out out [--label ...]`` as a user runs it; the rows of its ``comparison.csv``."""
    command = [sys.executable, "-m", "layerwise", "plot", *map(str, runs), "--out", str(out), "--format", "png"]
    command += ["--label", *labels] if labels else []  # the modes as the docs name them: standard, aligned
    command += ["--dpi", "200"]  # the docs' pictures (benchmarks/docs_figures.py draws them at 200 dpi too)
    print("running:", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    with (out / "comparison.csv").open(newline="") as file:
        return list(csv.DictReader(file))


def values_from(rows: list[dict[str, str]], epochs: int, seconds: list[float], reused: int) -> dict[str, Any]:
    """The record: every number of the table by quantity, mode and layer, and the gaps the docs cite."""
    table: dict[str, Any] = {}
    for row in rows:
        # the record keeps the model classes' names the docs' claims cite (the legends say them in words now)
        group = CLASSES.get(row["group"], row["group"])
        entry = table.setdefault(row["quantity"], {}).setdefault(group, {})
        entry[row["x"]] = {  # no mean: not reached (ε-effective depth where no layer reaches 1 - ε)
            "mean": None if row["mean"] == "" else round(float(row["mean"]), 4),
            "half_width": None if row["half_width"] == "" else round(float(row["half_width"]), 4),
            "seeds": int(row["seeds"]),
        }
    accuracy = table["accuracy"]
    standard, aligned = accuracy["Standard"], accuracy["AlternatingAligned"]
    layers = sorted(standard, key=int)
    gap = {layer: round(100 * (aligned[layer]["mean"] - standard[layer]["mean"]), 1) for layer in layers}
    percent = {
        mode: {layer: round(100 * accuracy[key][layer]["mean"], 1) for layer in layers}
        for mode, key in (("standard", "Standard"), ("aligned", "AlternatingAligned"))
    }
    half = {
        mode: {layer: round(100 * (accuracy[key][layer]["half_width"] or 0.0), 1) for layer in layers}
        for mode, key in (("standard", "Standard"), ("aligned", "AlternatingAligned"))
    }
    return {
        "epochs": epochs,
        "seeds": len(SEEDS),
        "last_layer": int(layers[-1]),
        "accuracy_percent": percent,
        "accuracy_half_width_percent": half,  # of the 95 % t-interval over the seeds
        "aligned_minus_standard_points": {f"layer_{layer}": value for layer, value in gap.items()},
        "last_layer_gap_points": gap[layers[-1]],
        "largest_gap_points": max(gap[layer] for layer in layers[:-1]),
        "fit_seconds_median": None if not seconds else round(sorted(seconds)[len(seconds) // 2], 1),
        "fits_reused": reused,  # --reuse: fits run earlier into --run-dir (their times are not in this record)
        "table": table,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, help="where the fits write their runs, kept (default: a temporary one)")
    parser.add_argument("--epochs", type=int, help="epochs per fit (default: the config's 40); the record says so")
    parser.add_argument("--reuse", action="store_true", help="skip the fits whose run under --run-dir is complete")
    parser.add_argument("--no-record", action="store_true", help="draw and print, but record nothing (a smoke run)")
    args = parser.parse_args()
    run_dir = (args.run_dir or Path(tempfile.mkdtemp(prefix="layerwise_training_modes_"))).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, nproc {affinity}, runs under {run_dir}", flush=True)
    load_before = load_now()
    try:
        runs, seconds, reused = [], [], 0
        for mode in MODES:
            for seed in SEEDS:
                run, took = fit(run_dir, mode, seed, args.epochs, args.reuse)
                runs.append(run)
                seconds += [] if took is None else [took]
                reused += took is None
        rows = compare(runs, run_dir / "comparison", [mode for mode in MODES for _ in SEEDS])
    except (RuntimeError, subprocess.CalledProcessError) as error:
        print(error, file=sys.stderr)
        return 2
    finally:
        if args.run_dir is None:
            print(f"(runs kept in {run_dir} until the end of the comparison)")
    values = values_from(rows, args.epochs or 40, seconds, reused)
    print(json.dumps({key: value for key, value in values.items() if key != "table"}, indent=1))
    print((run_dir / "comparison" / "comparison.md").read_text())
    if not args.no_record:
        record("training_modes", values, load_before)
        FIGURES.mkdir(exist_ok=True)
        for name in ("accuracy", "cos"):
            shutil.copyfile(run_dir / "comparison" / f"comparison_{name}.png", FIGURES / f"training_modes_{name}.png")
            print(f"copied -> docs/figures/training_modes_{name}.png")
    if args.run_dir is None:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
