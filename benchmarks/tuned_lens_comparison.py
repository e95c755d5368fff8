"""The comparison the paper invites: the logit lens of aligned training against a tuned lens on a standard model.

On the shipped digits quickstart, for standard and aligned training (``benchmarks/training_modes.py``'s fits:
``configs/quickstart.yaml`` as shipped and with ``--model.class_path=layerwise.lightning_modules.Standard``), seeds 0,
1 and 2: every trained model gets a tuned lens (``layerwise fit --config configs/tuned_lens/digits_vit.yaml``, the
model's ``last.ckpt``, the same seed), then each model is validated twice on the same 360 digits: read by the logit
lens (the model's own head) and through its tuned lens (``LogitLensMonitor(lens=<run>/tuned_lens.safetensors)``).
The four combinations are drawn side by side with ``layerwise plot RUN... --label ...`` (per-layer accuracy and KL to
the final layer's distribution, each group's seeds as their mean and 95 % t-interval) and recorded in
``benchmarks/recorded/tuned_lens_comparison.json``; the accuracy and KL figures are copied to
``docs/figures/tuned_lens_accuracy.png`` and ``tuned_lens_kl.png``.

    python benchmarks/tuned_lens_comparison.py                        # 6 fits of 40 epochs + 6 lenses of 10
    python benchmarks/tuned_lens_comparison.py --epochs 15 --lens-epochs 5 --run-dir /tmp/tl --reuse

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
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import load_now, record  # noqa: E402
from training_modes import MODES, SEEDS, fit  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LENS_CONFIG = REPO / "configs" / "tuned_lens" / "digits_vit.yaml"
FIGURES = REPO / "docs" / "figures"
LENSES = ("logit", "tuned")


def fit_lens(run_dir: Path, base: Path, mode: str, seed: int, epochs: Optional[int], reuse: bool) -> Path:
    """A tuned lens of the model in ``base`` (its last.ckpt): the lens run's folder."""
    name = f"{mode}_seed{seed}_lens"
    run = run_dir / "runs" / name / "version_0"
    if reuse and (run / "tuned_lens.safetensors").exists():
        print(f"reusing {run}", flush=True)
        return run
    if run.parent.exists():
        shutil.rmtree(run.parent)
    command = [
        sys.executable,
        "-m",
        "layerwise",
        "fit",
        "--config",
        str(LENS_CONFIG),
        f"--model.init_args.checkpoint={base / 'checkpoints' / 'last.ckpt'}",
        f"--seed_everything={seed}",
        f"--trainer.logger.init_args.save_dir={run_dir / 'runs'}",
        f"--trainer.logger.init_args.name={name}",
        "--trainer.enable_progress_bar=false",
        *([] if epochs is None else [f"--trainer.max_epochs={epochs}"]),
    ]
    print("running:", " ".join(command), flush=True)
    log = run_dir / f"{name}.log"
    with log.open("w") as output:
        status = subprocess.call(command, cwd=run_dir, stdout=output, stderr=subprocess.STDOUT)
    if status != 0:
        raise RuntimeError(f"the {name} fit exited with {status}:\n{log.read_text(errors='replace')[-3000:]}")
    return run


def evaluate(run_dir: Path, base: Path, lens_run: Path, mode: str, seed: int) -> dict[str, Path]:
    """The model of ``base`` validated through each lens: ``{lens: folder of its summary}``."""
    import lightning.pytorch as pl

    from layerwise.callbacks import LayerwiseAnalysis, LogitLensMonitor
    from layerwise.datamodules import DigitsDataModule
    from layerwise.engines.checkpoint import load_module

    folders = {}
    for lens in LENSES:
        folder = run_dir / "evaluations" / f"{mode}_{lens}_seed{seed}"
        shutil.rmtree(folder, ignore_errors=True)
        choice = "logit" if lens == "logit" else str(lens_run / "tuned_lens.safetensors")
        analysis = LayerwiseAnalysis(logit_lens=LogitLensMonitor(lens=choice), log_figures=False, print_table=False)
        trainer = pl.Trainer(
            accelerator="cpu",
            logger=pl.loggers.CSVLogger(folder.parent, name=folder.name, version=0),
            callbacks=[analysis],
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        module = load_module(str(base / "checkpoints" / "last.ckpt"))
        trainer.validate(module, DigitsDataModule(batch_size=64, val_fraction=0.2, seed=0), verbose=False)
        folders[lens] = folder / "version_0"
    return folders


def compare(groups: dict[str, list[Path]], out: Path) -> list[dict[str, str]]:
    """``layerwise plot RUN... --label ...`` of the four groups; the rows of its ``comparison.csv``."""
    runs = [run for members in groups.values() for run in members]
    labels = [label for label, members in groups.items() for _ in members]
    command = [sys.executable, "-m", "layerwise", "plot", *map(str, runs), "--out", str(out), "--format", "png"]
    command += ["--label", *labels]
    print("running:", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    with (out / "comparison.csv").open(newline="") as file:
        return list(csv.DictReader(file))


def values_from(rows: list[dict[str, str]], epochs: int, lens_epochs: int) -> dict[str, Any]:
    """The record: accuracy (percent) and KL (nats) per group and layer, mean and half-width over the seeds."""
    table: dict[str, Any] = {}
    for row in rows:
        if row["quantity"] not in ("accuracy", "kl_to_final"):
            continue
        entry = table.setdefault(row["quantity"], {}).setdefault(row["group"].replace("+", "_"), {})
        scale = 100 if row["quantity"] == "accuracy" else 1
        entry[row["x"]] = {
            "mean": round(scale * float(row["mean"]), 4 if scale == 1 else 1),
            "half_width": None if row["half_width"] == "" else round(scale * float(row["half_width"]), 4),
        }
    accuracy = table["accuracy"]
    layers = sorted(accuracy["standard_logit"], key=int)
    shallow = layers[:-1]
    aligned_logit_minus_standard_tuned = {
        f"layer_{layer}": round(accuracy["aligned_logit"][layer]["mean"] - accuracy["standard_tuned"][layer]["mean"], 1)
        for layer in layers
    }
    return {
        "epochs": epochs,
        "lens_epochs": lens_epochs,
        "seeds": len(SEEDS),
        "aligned_logit_minus_standard_tuned_points": aligned_logit_minus_standard_tuned,
        "aligned_logit_beats_standard_tuned_layers": [
            int(layer) for layer in shallow if aligned_logit_minus_standard_tuned[f"layer_{layer}"] > 0
        ],
        "table": table,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, help="where the runs go, kept (default: a temporary folder)")
    parser.add_argument("--epochs", type=int, help="epochs per model fit (default: the quickstart's 40)")
    parser.add_argument("--lens-epochs", type=int, help="epochs per tuned-lens fit (default: the config's 10)")
    parser.add_argument("--reuse", action="store_true", help="skip the fits whose run under --run-dir is complete")
    parser.add_argument("--no-record", action="store_true", help="draw and print, but record nothing (a smoke run)")
    args = parser.parse_args()
    run_dir = (args.run_dir or Path(tempfile.mkdtemp(prefix="layerwise_tuned_lens_"))).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, nproc {affinity}, runs under {run_dir}", flush=True)
    load_before = load_now()
    groups: dict[str, list[Path]] = {f"{mode}+{lens}": [] for mode in MODES for lens in LENSES}
    try:
        for mode in MODES:
            for seed in SEEDS:
                base, _ = fit(run_dir, mode, seed, args.epochs, args.reuse)
                lens_run = fit_lens(run_dir, base, mode, seed, args.lens_epochs, args.reuse)
                for lens, folder in evaluate(run_dir, base, lens_run, mode, seed).items():
                    groups[f"{mode}+{lens}"].append(folder)
        rows = compare(groups, run_dir / "comparison")
    except (RuntimeError, subprocess.CalledProcessError) as error:
        print(error, file=sys.stderr)
        return 2
    values = values_from(rows, args.epochs or 40, args.lens_epochs or 10)
    print(json.dumps({key: value for key, value in values.items() if key != "table"}, indent=1))
    print((run_dir / "comparison" / "comparison.md").read_text())
    if not args.no_record:
        record("tuned_lens_comparison", values, load_before)
        FIGURES.mkdir(exist_ok=True)
        for name, figure in (("accuracy", "accuracy"), ("kl", "kl_to_final")):
            shutil.copyfile(run_dir / "comparison" / f"comparison_{figure}.png", FIGURES / f"tuned_lens_{name}.png")
            print(f"copied -> docs/figures/tuned_lens_{name}.png")
    if args.run_dir is None:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
