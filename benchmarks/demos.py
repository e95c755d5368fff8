"""Run an offline demonstration (both training modes) and print the per-layer table the README shows.

    python benchmarks/demos.py shakespeare   # small GPT on Tiny Shakespeare: standard vs alternating aligned
    python benchmarks/demos.py sst2          # small BERT on SST-2: standard vs aligned
    python benchmarks/demos.py compare       # small GPTs on Tiny Shakespeare compared: seeds, ReLU, aligned
    python benchmarks/demos.py ablation      # MLP on digits with and without residual connections (App. B.2)
    python benchmarks/demos.py transfer      # ViT on digits 0-4: shifted validation, probes on 5-9 (App. B.4)

Each mode is one ``layerwise fit --config configs/demo/<name>.yaml`` (the documented command), run here one after
the other with its wall time; the table is read from the last validation JSON of each run. For Shakespeare, text is
then generated from the middle layer and the last layer of each model with ``layerwise generate``, and the block
coupling that ``BlockCoupling`` measured at every validation is tabulated against the untrained model's
(``layerwise validate`` of the same config and seed). Every demo records its wall times, with the machine and its
load, in ``benchmarks/recorded/demos_<name>.json`` (``_record.record``): the numbers README cites.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from layerwise.results import is_summary, summary_order

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import load_now, record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEMOS = {
    "shakespeare": ("shakespeare_gpt_standard", "shakespeare_gpt_alternating"),
    "sst2": ("sst2_bert_standard", "sst2_bert_aligned"),
    "ablation": ("ablation/mlp_residual", "ablation/mlp_plain"),
    "transfer": ("transfer/digits_vit_standard", "transfer/digits_vit_aligned"),
}
PROMPT = "ROMEO:\n"


def run(config: str, out: Path, overrides: tuple[str, ...] = (), name: str = "") -> tuple[float, Path]:
    """Train one config (``configs/demo/<config>.yaml``, or ``configs/<folder>/<name>.yaml`` for ``folder/name``)
    into ``out`` (under ``name``, default the config's logger name) and return its wall time and its run folder."""
    path = f"configs/{config}.yaml" if "/" in config else f"configs/demo/{config}.yaml"
    command = [sys.executable, "-m", "layerwise", "fit", "--config", path]
    command += [f"--trainer.logger.init_args.save_dir={out}", "--trainer.enable_progress_bar=false", *overrides]
    if name:
        command.append(f"--trainer.logger.init_args.name={name}")
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True)
    seconds = time.perf_counter() - start
    logged = name or yaml.safe_load((ROOT / path).read_text())["trainer"]["logger"]["init_args"]["name"]
    versions = sorted((out / logged).glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    return seconds, versions[-1]


def validate_at_init(config: str, out: Path) -> dict:
    """``layerwise validate`` of the config's untrained model (the same seed, so the fit's initial weights)."""
    command = [sys.executable, "-m", "layerwise", "validate", "--config", f"configs/demo/{config}.yaml"]
    command += [f"--trainer.logger.init_args.save_dir={out}", "--trainer.enable_progress_bar=false"]
    subprocess.run(command, cwd=ROOT, check=True)
    versions = sorted((out / config).glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    return last_summary(versions[-1])


def all_summaries(run_dir: Path) -> list[dict]:
    files = sorted((p for p in (run_dir / "layerwise").glob("val_epoch_*.json") if is_summary(p)), key=summary_order)
    return [json.loads(path.read_text()) for path in files]


def coupling_table(rows: list[tuple[str, int, dict]]) -> str:
    """One row per (model, step): coupling score per K, LSS, expodistance, linearisation cosine."""
    ks = rows[0][2]["coupling"]["ks"]
    header = "| model | step | " + " | ".join(f"coupling K={k}" for k in ks) + " | LSS | ED | lin. cos |"
    lines = [header, "|" + "---|" * (5 + len(ks))]
    for name, step, summary in rows:
        c = summary["coupling"]
        scores = " | ".join(f"{value:.4f}" for value in c["coupling_score"])
        lines.append(
            f"| {name} | {step} | {scores} | {c['trajectory_lss']:.3f} | {c['trajectory_expodistance']:.3f} "
            f"| {c['linearisation_cosine']:.3f} |"
        )
    return "\n".join(lines)


def last_summary(run_dir: Path, stage: str = "val") -> dict:
    files = sorted(
        (p for p in (run_dir / "layerwise").glob(f"{stage}_epoch_*.json") if is_summary(p)), key=summary_order
    )
    return json.loads(files[-1].read_text())


def table(summaries: dict[str, dict], keys: list[str]) -> str:
    layers = next(iter(summaries.values()))["layers"]
    header = "| layer | " + " | ".join(f"{name} {key}" for key in keys for name in summaries) + " |"
    lines = [header, "|" + "---|" * (1 + len(keys) * len(summaries))]
    for index, layer in enumerate(layers):
        cells = [f"{summaries[name][key][index]:.4f}" for key in keys for name in summaries]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def generate(run_dir: Path, layers: list[int]) -> list[str]:
    command = [sys.executable, "-m", "layerwise", "generate", "--checkpoint", str(run_dir / "checkpoints/last.ckpt")]
    command += ["--tokenizer", "byte", "--prompt", PROMPT, "--layers", *map(str, layers), "--max_new_tokens", "56"]
    command += ["--strategy", "top_k", "--top_k", "10", "--seed", "0", "--out", str(run_dir / "generated.json")]
    command += ["--overwrite", "true"]  # a rerun of the demo replaces its own texts
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    return json.loads((run_dir / "generated.json").read_text())


# --------------------------------------------------------------------------------------------- comparing models
COMPARE_RUNS = {  # name -> (config, overrides): small GPTs on Tiny Shakespeare that differ in one thing
    "seed0": ("shakespeare_gpt_standard", []),
    "seed1": ("shakespeare_gpt_standard", ["--seed_everything=1"]),
    "relu": (
        "shakespeare_gpt_standard",
        ["--model.init_args.backbone.init_args.config_overrides.activation_function=relu"],
    ),
    "alternating": ("shakespeare_gpt_alternating", []),
}
COMPARE_PAIRS = (("seed0", "seed1"), ("seed0", "relu"), ("seed0", "alternating"))
TEXT = "../shared/data/tinyshakespeare/input.txt"


def trained(name: str, out: Path) -> Path:
    """``last.ckpt`` of run ``name`` under ``out`` (trained here unless a version of it is already there)."""
    found = sorted((out / name).glob("version_*/checkpoints/last.ckpt"))
    if found:
        return found[-1]
    config, overrides = COMPARE_RUNS[name]
    command = [sys.executable, "-m", "layerwise", "fit", "--config", f"configs/demo/{config}.yaml", *overrides]
    command += [f"--trainer.logger.init_args.save_dir={out}", f"--trainer.logger.init_args.name={name}"]
    subprocess.run([*command, "--trainer.enable_progress_bar=false"], cwd=ROOT, check=True)
    return sorted((out / name).glob("version_*/checkpoints/last.ckpt"))[-1]


def compare_demo(out: Path) -> None:
    """CKA, arccos distance and stitching penalties of the pairs, with the documented commands."""
    load_before, start = load_now(), time.perf_counter()
    checkpoints = {name: trained(name, out) for name in COMPARE_RUNS}
    training = time.perf_counter() - start
    values: dict = {"training_minutes": round(training / 60, 2)}
    lines = ["| A vs B | arccos distance | CKA of layers 0..4 | penalty vs B at l = m = 1, 2, 3 |", "|---|---|---|---|"]
    for first, second in COMPARE_PAIRS:
        common = ["--model_a", str(checkpoints[first]), "--model_b", str(checkpoints[second]), "--text", TEXT]
        common += ["--tokenizer", "byte", "--block_size", "64", "--overwrite", "true"]  # a rerun replaces its results
        target = out / "compare" / f"{first}_vs_{second}"
        start = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "layerwise",
                "compare",
                *common,
                "--max_blocks",
                "256",
                "--include_embeddings",
                "true",
                "--out",
                str(target),
            ],
            cwd=ROOT,
            check=True,
        )
        subprocess.run(
            [
                sys.executable,
                "-m",
                "layerwise",
                "stitch",
                *common,
                "--steps",
                "500",
                "--warmup_steps",
                "50",
                "--phi_init",
                "zero",  # README's table was measured from the identity start (the default: least squares)
                "--dev_blocks",
                "0",  # and phi of the last step, before the dev slice existed (the default: the best of 20 checks)
                "--max_train_blocks",
                "4000",
                "--max_val_blocks",
                "128",
                "--accelerator",
                "cpu",
                "--out",
                str(target),
            ],
            cwd=ROOT,
            check=True,
        )
        compared = json.loads((target / "compare.json").read_text())
        stitched = json.loads((target / "stitch.json").read_text())["rows"]
        diagonal = ", ".join(f"{row[i]:.3f}" for i, row in enumerate(compared["cka"]))
        penalties = ", ".join(f"{row['penalty_b']:+.3f}" for row in stitched)
        lines.append(f"| {first} vs {second} | {compared['arccos_distance']:.3f} | {diagonal} | {penalties} |")
        seconds = time.perf_counter() - start
        values[f"{first}_vs_{second}_s"] = round(seconds, 1)
        values[f"{first}_vs_{second}_penalties_b"] = [round(row["penalty_b"], 4) for row in stitched]
        print(f"{first} vs {second}: {seconds:.0f} s", flush=True)
    print("\n".join(lines))
    pairs = sum(values[f"{first}_vs_{second}_s"] for first, second in COMPARE_PAIRS)
    values["compare_and_stitch_minutes"] = round(pairs / 60, 2)
    record("demos_compare", values, load_before)


def sst2_comparison(runs: dict[str, Path], out: Path) -> None:
    """The standard encoder against the aligned one: CKA across models, then stitching at l = m = 1, 2, 3."""
    import lightning.pytorch as pl

    from layerwise.datamodules import GLUEDataModule
    from layerwise.engines.checkpoint import load_model
    from layerwise.lightning_modules.stitched import Stitched

    standard, aligned = (runs[name] / "checkpoints" / "last.ckpt" for name in ("standard", "aligned"))
    command = [sys.executable, "-m", "layerwise", "validate", "--config", "configs/demo/sst2_bert_standard.yaml"]
    command += [f"--ckpt_path={standard}", "--trainer.callbacks+=layerwise.callbacks.CrossModelComparison"]
    command += [f"--trainer.callbacks.model_b={aligned}", "--trainer.callbacks.include_embeddings=true"]
    command += ["--trainer.callbacks.minibatch=true", "--trainer.callbacks.chunk=512"]
    command += [f"--trainer.logger.init_args.save_dir={out / 'compare'}", "--trainer.enable_progress_bar=false"]
    subprocess.run(command, cwd=ROOT, check=True)
    compared = last_summary(sorted((out / "compare" / "sst2_bert_standard").glob("version_*"))[-1])["compare"]
    print(
        f"\nCKA standard vs aligned (layers 0..4), {compared['num_tokens']} tokens: "
        + ", ".join(f"{row[i]:.3f}" for i, row in enumerate(compared["cka"]))
        + f"; arccos distance {compared['arccos_distance']:.3f}"
    )
    data = GLUEDataModule(
        task="sst2",
        data_dir=str(ROOT.parent / "shared/data/sst2"),
        tokenizer="wordpiece:8000",
        max_length=64,
        batch_size=32,
        max_train_samples=12000,
    )
    data.prepare_data()
    data.setup("fit")
    model_a, model_b = (
        load_model(str(path), name, "classification") for path, name in ((standard, "A"), (aligned, "B"))
    )
    print("\n| l = m | stitched accuracy | drop vs aligned (B) | drop vs standard (A) | penalty vs B (nats) |")
    print("|---|---|---|---|---|")
    for layer in (1, 2, 3):
        pl.seed_everything(0, verbose=False)  # the order of the training sentences
        module = Stitched(  # identity start (phi_init zero), as README's table was measured
            model_a, model_b, layer, layer, task="classification", phi_init="zero", warmup_steps=30, max_steps=300
        )
        trainer = pl.Trainer(
            accelerator="cpu",
            max_steps=300,
            gradient_clip_val=1.0,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(module, data.train_dataloader())
        values = trainer.validate(module, data.val_dataloader(), verbose=False)[0]
        print(
            f"| {layer} | {values['val/acc_stitched']:.4f} | {values['val/acc_drop_b']:+.4f} | "
            f"{values['val/acc_drop_a']:+.4f} | {values['val/penalty_b']:+.4f} |",
            flush=True,
        )


def ablation(summaries: dict[str, dict], out: Path) -> None:
    """Accuracy, COS and CKA to the last layer with and without residual connections, and their figures."""
    from layerwise.figures.style import drawn_at, provenance_metadata, untitled
    from layerwise.figures.summary import similarity_and_accuracy
    from layerwise.results import save_figure_atomic

    for summary in summaries.values():
        summary["cos_to_last"] = [row[-1] for row in summary["cos"]]
        summary["cka_to_last"] = [row[-1] for row in summary["cka"]]
    print(table(summaries, ["accuracy", "cos_to_last", "cka_to_last"]))
    for name, summary in summaries.items():
        path = out / f"ablation_{name}.png"
        with drawn_at("column"):  # the docs show the two side by side
            figure = similarity_and_accuracy(summary)
            untitled(figure)  # the docs' table says which is which; the title stays in the file's metadata
        save_figure_atomic(path, figure, dpi=200, metadata=provenance_metadata(figure, "png"))
        print(f"-> {path}")


def transfer(runs: dict[str, Path], out: Path) -> None:
    """Per-layer accuracy on clean and corrupted digits 0-4, and of linear probes on digits 5-9, standard vs aligned."""
    from layerwise.figures.style import (
        drawn_at,
        finish,
        group_style,
        layer_ticks,
        legend_below,
        new_figure,
        provenance_metadata,
    )
    from layerwise.results import save_figure_atomic

    rows: dict[str, list[float]] = {}
    for name, run_dir in runs.items():
        rows[f"{name} clean 0-4"] = last_summary(run_dir)["accuracy"]
        rows[f"{name} corrupted 0-4"] = last_summary(run_dir, stage="val_corrupted")["accuracy"]
        checkpoint = run_dir / "checkpoints" / "last.ckpt"
        seconds, probe_dir = run(
            "transfer/digits_probe", out, (f"--model.init_args.checkpoint={checkpoint}",), name=f"probe_{name}"
        )
        print(f"probes on {name}: {seconds:.0f} s, {probe_dir}", flush=True)
        rows[f"{name} probe 5-9"] = last_summary(probe_dir)["accuracy"]
    layers = list(range(1, len(next(iter(rows.values()))) + 1))
    print("| layer | " + " | ".join(rows) + " |")
    print("|" + "---|" * (len(rows) + 1))
    for index, layer in enumerate(layers):
        print(f"| {layer} | " + " | ".join(f"{values[index]:.4f}" for values in rows.values()) + " |")
    with drawn_at("page"):
        fig, ax = new_figure(6.4, 4.0)
        dashes = {"clean": "-", "corrupted": "--", "probe": ":"}
        for key, values in rows.items():
            model, what = key.split()[:2]
            style = group_style(0 if model == "standard" else 1)  # colour and marker per model, dash per data
            ax.plot(layers, values, color=style["color"], marker=style["marker"], linestyle=dashes[what], label=key)
        layer_ticks(ax, layers, axis="x", at_values=True)
        ax.set_xlabel("layer")
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        legend_below(fig, handles, labels, max_columns=3)
        ax.set_title("transfer: shared head on clean / corrupted digits 0-4, linear probes on 5-9")
        finish(fig)
    path = out / "transfer.png"
    save_figure_atomic(path, fig, dpi=200, metadata=provenance_metadata(fig, "png"))
    print(f"-> {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("demo", choices=sorted(DEMOS) + ["compare"])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "demos")
    args = parser.parse_args()
    if args.demo == "compare":
        compare_demo(args.out)
        return
    summaries, runs, total = {}, {}, 0.0
    load_before, start = load_now(), time.perf_counter()
    values: dict = {}
    for config in DEMOS[args.demo]:
        seconds, run_dir = run(config, args.out)
        total += seconds
        name = config.split("_")[-1]
        summaries[name], runs[name] = last_summary(run_dir), run_dir
        values[f"{name}_s"] = round(seconds, 1)
        print(f"{config}: {seconds:.0f} s, {run_dir}", flush=True)
    print(f"\nboth runs: {total:.0f} s ({total / 60:.1f} min)\n")
    values["both_runs_minutes"] = round(total / 60, 2)
    for name, summary in summaries.items():
        values[f"{name}_accuracy"] = [round(value, 4) for value in summary["accuracy"]]
    demo(args.demo, summaries, runs, args.out)
    values["whole_script_minutes"] = round((time.perf_counter() - start) / 60, 2)
    record(f"demos_{args.demo}", values, load_before)


def demo(which: str, summaries: dict[str, dict], runs: dict[str, Path], out: Path) -> None:
    """What each demo does after its two runs: tables, comparison, coupling, generated text, figures."""
    keys = ["accuracy", "perplexity"] if which == "shakespeare" else ["accuracy"]
    if which == "ablation":
        ablation(summaries, out)
        return
    if which == "transfer":
        transfer(runs, out)
        return
    print(table(summaries, keys))
    if which == "sst2":
        sst2_comparison(runs, out)
    if which == "shakespeare":
        start = time.perf_counter()
        init = validate_at_init(DEMOS[which][0], out / "init")
        rows = [("(initialisation)", 0, init)]
        for name, run_dir in runs.items():
            rows += [(name, summary["global_step"], summary) for summary in all_summaries(run_dir)]
        print(f"\nblock coupling (16 validation blocks, last token; init: {time.perf_counter() - start:.0f} s):\n")
        print(coupling_table(rows))
        depth = next(iter(summaries.values()))["depth"]
        for name, run_dir in runs.items():
            print(f"\n{name}: generated from layers {depth // 2} and {depth} (top-k 10, seed 0):")
            print(json.dumps(generate(run_dir, [depth // 2, depth]), indent=1)[:3000])


if __name__ == "__main__":
    main()
