"""The comparison the paper invites: the logit lens of aligned training against a tuned lens on a standard model.

Two families of shipped offline models (``--family``):

- ``digits`` (default): the digits quickstart, standard and aligned (``benchmarks/training_modes.py``'s fits:
  ``configs/quickstart.yaml`` as shipped and with ``--model.class_path=layerwise.lightning_modules.Standard``), each
  with a tuned lens of ``configs/tuned_lens/digits_vit.yaml``, validated on the same 360 digits;
- ``shakespeare``: the Tiny Shakespeare GPT-2 (4 blocks, width 128, byte tokens), standard and aligned
  (``configs/demo/shakespeare_gpt_standard.yaml`` and ``shakespeare_gpt_alternating.yaml`` as shipped, 1,000 steps),
  each with a tuned lens of ``configs/tuned_lens/shakespeare_gpt.yaml`` (500 steps), validated on the same 256
  blocks of 64 bytes (every 4th token, as the configs' analysis reads them); the text from ``--data``.

For seeds 0, 1 and 2 (``--seeds``): every trained model gets a tuned lens (the model's ``last.ckpt``, the same seed),
then each model is validated twice on the same data: read by the logit lens (the model's own head) and through its
tuned lens (``LogitLensMonitor(lens=<run>/tuned_lens.safetensors)``). The four combinations are drawn side by side
with ``layerwise plot RUN... --label ...`` (per-layer accuracy and KL to the final layer's distribution, each group's
seeds as their mean and 95 % t-interval) and recorded in ``benchmarks/recorded/tuned_lens_comparison.json``
(``tuned_lens_comparison_shakespeare.json``); the accuracy and KL figures are copied to
``docs/figures/tuned_lens_accuracy.png`` and ``tuned_lens_kl.png`` (``tuned_lens_shakespeare_*.png``).

    python benchmarks/tuned_lens_comparison.py                        # 6 fits of 40 epochs + 6 lenses of 10
    python benchmarks/tuned_lens_comparison.py --epochs 15 --lens-epochs 5 --run-dir /tmp/tl --reuse
    python benchmarks/tuned_lens_comparison.py --family shakespeare   # 6 fits of 1,000 steps + 6 lenses of 500
    python benchmarks/tuned_lens_comparison.py --family shakespeare --steps 300 --lens-steps 150 --seeds 0

``--modes standard`` (or ``aligned``) with ``--no-record`` runs one mode's fits only, so that two processes can share
the work on two cores; a last run with ``--reuse`` then draws and records the whole comparison.

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
from training_modes import MODES, SEEDS, fit, fitted, run_fit  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LENS_CONFIGS = {
    "digits": REPO / "configs" / "tuned_lens" / "digits_vit.yaml",
    "shakespeare": REPO / "configs" / "tuned_lens" / "shakespeare_gpt.yaml",
}
LENS_CONFIG = LENS_CONFIGS["digits"]
SHAKESPEARE = {  # mode -> the shipped config of the Tiny Shakespeare GPT
    "standard": REPO / "configs" / "demo" / "shakespeare_gpt_standard.yaml",
    "aligned": REPO / "configs" / "demo" / "shakespeare_gpt_alternating.yaml",
}
SHAKESPEARE_TEXT = REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"  # the configs' ../shared/data
FIGURES = REPO / "docs" / "figures"
LENSES = ("logit", "tuned")


def label(mode: str, lens: str) -> str:
    """A group's legend, in words: ``standard + logit lens``."""
    return f"{mode} + {lens} lens"


def key(group: str) -> str:
    """A group's key in the record: ``standard + logit lens`` -> ``standard_logit`` (the docs' claims cite it)."""
    mode, lens = group.removesuffix(" lens").split(" + ")
    return f"{mode}_{lens}"


def steps_options(steps: Optional[int], scheduler: bool) -> list[str]:
    """Options that shorten a step-budgeted fit (the Shakespeare configs) to ``steps``; none for the config's own."""
    if steps is None:
        return []
    options = [f"--trainer.max_steps={steps}", f"--trainer.val_check_interval={min(250, steps)}"]
    if scheduler:  # the model fits' warm-up cosine counts steps (scheduler_interval: step)
        options += [f"--model.init_args.lr_scheduler.init_args.max_epochs={steps}"]
    return options


def fit_shakespeare(
    run_dir: Path, mode: str, seed: int, steps: Optional[int], text: Path, reuse: bool
) -> tuple[Path, Optional[float]]:
    """One Tiny Shakespeare GPT fit in ``mode`` with ``seed`` (its shipped config): its run folder and wall seconds."""
    arguments = [
        "--config",
        str(SHAKESPEARE[mode]),
        f"--seed_everything={seed}",
        f"--data.init_args.train_files=[{text}]",
        *steps_options(steps, scheduler=True),
    ]
    return run_fit(run_dir, f"{mode}_seed{seed}", arguments, fitted if reuse else None)


def fit_lens(
    run_dir: Path,
    base: Path,
    mode: str,
    seed: int,
    epochs: Optional[int],
    reuse: bool,
    family: str = "digits",
    text: Optional[Path] = None,
) -> Path:
    """A tuned lens of the model in ``base`` (its last.ckpt): the lens run's folder.

    ``epochs``: the digits lens's epochs, or the Shakespeare lens's steps (None: the config's).
    """
    arguments = [
        "--config",
        str(LENS_CONFIGS[family]),
        f"--model.init_args.checkpoint={base / 'checkpoints' / 'last.ckpt'}",
        f"--seed_everything={seed}",
    ]
    if family == "shakespeare":
        arguments += [f"--data.init_args.train_files=[{text}]", *steps_options(epochs, scheduler=False)]
    elif epochs is not None:
        arguments += [f"--trainer.max_epochs={epochs}"]
    lens_done = (lambda run: (run / "tuned_lens.safetensors").exists()) if reuse else None
    return run_fit(run_dir, f"{mode}_seed{seed}_lens", arguments, lens_done)[0]


def datamodule(family: str, text: Optional[Path]) -> Any:
    """The validation data of a family: the fits' own (digits: 360 digits; Shakespeare: 256 blocks of 64 bytes)."""
    from layerwise.datamodules import DigitsDataModule, TextDataModule

    if family == "digits":
        return DigitsDataModule(batch_size=64, val_fraction=0.2, seed=0)
    return TextDataModule(
        train_files=[str(text)], val_fraction=0.1, tokenizer="byte", block_size=64, batch_size=32, max_val_blocks=256
    )


def evaluate(
    run_dir: Path,
    base: Path,
    lens_run: Path,
    mode: str,
    seed: int,
    family: str = "digits",
    text: Optional[Path] = None,
    reuse: bool = False,
) -> dict[str, Path]:
    """The model of ``base`` validated through each lens: ``{lens: folder of its summary}``.

    ``reuse``: keep an evaluation already written after the model's and the lens's files (the same validation).
    """
    import lightning.pytorch as pl

    from layerwise.callbacks import LayerwiseAnalysis, LogitLensMonitor
    from layerwise.engines.checkpoint import load_module

    stride = {"token_stride": 4} if family == "shakespeare" else {}  # the Shakespeare configs' analysis reads so

    folders = {}
    for lens in LENSES:
        folder = run_dir / "evaluations" / f"{mode}_{lens}_seed{seed}"
        choice = "logit" if lens == "logit" else str(lens_run / "tuned_lens.safetensors")
        written = sorted((folder / "version_0" / "layerwise").glob("val_epoch_*.json"))
        inputs = [base / "checkpoints" / "last.ckpt", *([] if lens == "logit" else [Path(choice)])]
        if reuse and written and written[-1].stat().st_mtime > max(path.stat().st_mtime for path in inputs):
            print(f"reusing {folder}", flush=True)
            folders[lens] = folder / "version_0"
            continue
        shutil.rmtree(folder, ignore_errors=True)
        analysis = LayerwiseAnalysis(
            logit_lens=LogitLensMonitor(lens=choice), log_figures=False, print_table=False, **stride
        )
        trainer = pl.Trainer(
            accelerator="cpu",
            logger=pl.loggers.CSVLogger(folder.parent, name=folder.name, version=0),
            callbacks=[analysis],
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        module = load_module(str(base / "checkpoints" / "last.ckpt"))
        trainer.validate(module, datamodule(family, text), verbose=False)
        folders[lens] = folder / "version_0"
    return folders


def compare(groups: dict[str, list[Path]], out: Path) -> list[dict[str, str]]:
    """``layerwise plot RUN... --label ...`` of the four groups; the rows of its ``comparison.csv``."""
    runs = [run for members in groups.values() for run in members]
    labels = [label for label, members in groups.items() for _ in members]
    command = [sys.executable, "-m", "layerwise", "plot", *map(str, runs), "--out", str(out), "--format", "png"]
    command += ["--label", *labels, "--dpi", "200"]  # the docs' pictures are drawn at 200 dpi
    print("running:", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    with (out / "comparison.csv").open(newline="") as file:
        return list(csv.DictReader(file))


def values_from(
    rows: list[dict[str, str]], epochs: int, lens_epochs: int, seeds: tuple[int, ...] = SEEDS, unit: str = "epochs"
) -> dict[str, Any]:
    """The record: accuracy (percent) and KL (nats) per group and layer, mean and half-width over the seeds.

    ``unit``: what ``epochs`` and ``lens_epochs`` count (``steps`` for the Shakespeare fits: the record's keys say so).
    """
    table: dict[str, Any] = {}
    for row in rows:
        if row["quantity"] not in ("accuracy", "kl_to_final"):
            continue
        entry = table.setdefault(row["quantity"], {}).setdefault(key(row["group"]), {})
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
        unit: epochs,
        f"lens_{unit}": lens_epochs,
        "seeds": len(seeds),
        "seed_values": list(seeds),
        "aligned_logit_minus_standard_tuned_points": aligned_logit_minus_standard_tuned,
        "aligned_logit_beats_standard_tuned_layers": [
            int(layer) for layer in shallow if aligned_logit_minus_standard_tuned[f"layer_{layer}"] > 0
        ],
        "table": table,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=("digits", "shakespeare"), default="digits", help="which models")
    parser.add_argument("--run-dir", type=Path, help="where the runs go, kept (default: a temporary folder)")
    parser.add_argument("--epochs", type=int, help="digits: epochs per model fit (default: the quickstart's 40)")
    parser.add_argument("--lens-epochs", type=int, help="digits: epochs per tuned-lens fit (default: the config's 10)")
    parser.add_argument("--steps", type=int, help="shakespeare: steps per model fit (default: the configs' 1,000)")
    parser.add_argument("--lens-steps", type=int, help="shakespeare: steps per tuned-lens fit (default: 500)")
    parser.add_argument("--data", type=Path, default=SHAKESPEARE_TEXT, help="shakespeare: the Tiny Shakespeare text")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="seeds (default: 0 1 2)")
    parser.add_argument("--modes", nargs="+", choices=tuple(MODES), default=list(MODES), help="modes to fit")
    parser.add_argument("--reuse", action="store_true", help="skip the fits whose run under --run-dir is complete")
    parser.add_argument("--no-record", action="store_true", help="draw and print, but record nothing (a smoke run)")
    args = parser.parse_args()
    digits = args.family == "digits"
    if digits and (args.steps or args.lens_steps):
        parser.error("--steps/--lens-steps: the digits fits count epochs; use --epochs/--lens-epochs.")
    if not digits and (args.epochs or args.lens_epochs):
        parser.error("--epochs/--lens-epochs: the Shakespeare fits count steps; use --steps/--lens-steps.")
    if not digits and not args.data.is_file():
        parser.error(f"--data {args.data}: no such file (the Tiny Shakespeare text, input.txt).")
    text = None if digits else args.data.resolve()
    lens_budget = args.lens_epochs if digits else args.lens_steps
    run_dir = (args.run_dir or Path(tempfile.mkdtemp(prefix="layerwise_tuned_lens_"))).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, nproc {affinity}, {args.family}, runs under {run_dir}", flush=True)
    load_before = load_now()
    modes = [mode for mode in MODES if mode in args.modes]
    seeds = tuple(args.seeds)
    groups: dict[str, list[Path]] = {label(mode, lens): [] for mode in modes for lens in LENSES}
    try:
        for mode in modes:
            for seed in seeds:
                if digits:
                    base, _ = fit(run_dir, mode, seed, args.epochs, args.reuse)
                else:
                    base, _ = fit_shakespeare(run_dir, mode, seed, args.steps, text, args.reuse)
                lens_run = fit_lens(run_dir, base, mode, seed, lens_budget, args.reuse, args.family, text)
                folders = evaluate(run_dir, base, lens_run, mode, seed, args.family, text, args.reuse)
                for lens, folder in folders.items():
                    groups[label(mode, lens)].append(folder)
        if len(modes) < len(MODES):  # one mode's share of the work: the comparison needs both
            print(f"fitted {', '.join(modes)} only: run again with both modes and --reuse to compare", flush=True)
            return 0
        rows = compare(groups, run_dir / "comparison")
    except (RuntimeError, subprocess.CalledProcessError) as error:
        print(error, file=sys.stderr)
        return 2
    if digits:
        values = values_from(rows, args.epochs or 40, args.lens_epochs or 10, seeds)
    else:
        values = values_from(rows, args.steps or 1000, args.lens_steps or 500, seeds, unit="steps")
    print(json.dumps({key: value for key, value in values.items() if key != "table"}, indent=1))
    print((run_dir / "comparison" / "comparison.md").read_text())
    if not args.no_record:
        record("tuned_lens_comparison" + ("" if digits else "_shakespeare"), values, load_before)
        FIGURES.mkdir(exist_ok=True)
        prefix = "tuned_lens" if digits else "tuned_lens_shakespeare"
        for name, figure in (("accuracy", "accuracy"), ("kl", "kl_to_final")):
            shutil.copyfile(run_dir / "comparison" / f"comparison_{figure}.png", FIGURES / f"{prefix}_{name}.png")
            print(f"copied -> docs/figures/{prefix}_{name}.png")
    if args.run_dir is None:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
