"""Linear probes of the shipped transfer pipeline against scikit-learn's LogisticRegression, per layer.

    python benchmarks/probes.py                       # pretrain both modes (30 epochs each), then probe each
    python benchmarks/probes.py --pretrained standard=runs/demos/transfer_standard/version_0 \\
        aligned=runs/demos/transfer_aligned/version_0  # probe existing runs of the shipped pretraining configs

Pretraining is ``layerwise fit --config configs/transfer/digits_vit_{standard,aligned}.yaml`` and probing
``layerwise fit --config configs/transfer/digits_probe.yaml --model.init_args.checkpoint=...`` (the documented
commands, run as ``benchmarks/demos.py transfer`` runs them, each timed as a whole process). The reference fits
scikit-learn's ``LogisticRegression`` (lbfgs, multinomial, tol 1e-10) on the same frozen features of every layer
(the pretrained backbone on digits_probe.yaml's data): once at the C the probe chose on held-out samples,
C = 1 / (weight_decay * n) — the same objective, which the probe must match — and once at scikit-learn's default
C = 1. Prints README's per-layer table (clean / corrupted accuracy of the pretrained model, probe accuracy) and the
comparison, and records the probe accuracies, the largest gaps and the probe times in
``benchmarks/recorded/probes.json`` (``_record.py``), which README cites.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import load_now, record  # noqa: E402
from demos import last_summary, run  # noqa: E402

from layerwise.datamodules.digits import DigitsDataModule  # noqa: E402
from layerwise.engines.checkpoint import load_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def references(checkpoint: Path, weight_decays: list[float]) -> tuple[list[float], list[float]]:
    """LogisticRegression's validation accuracy per layer at the probe's chosen C and at C = 1, same features."""
    from sklearn.linear_model import LogisticRegression

    backbone = load_module(str(checkpoint), option="checkpoint").backbone.eval()
    data = DigitsDataModule(batch_size=64, val_fraction=0.2, seed=0, classes=[5, 6, 7, 8, 9])  # digits_probe.yaml
    data.setup()
    (train_x, train_y), (val_x, val_y) = data.train_set.tensors, data.val_set.tensors
    with torch.no_grad():
        train_h, val_h = backbone(train_x).double().numpy(), backbone(val_x).double().numpy()
    chosen, default = [], []
    for layer, decay in enumerate(weight_decays):
        for c, scores in ((1.0 / (decay * len(train_y)), chosen), (1.0, default)):
            fit = LogisticRegression(C=c, tol=1e-10, max_iter=100000).fit(train_h[layer], train_y.numpy())
            scores.append(float(fit.score(val_h[layer], val_y.numpy())))
    return chosen, default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "probes")
    parser.add_argument("--pretrained", nargs="*", default=[], help="mode=run_dir of existing pretraining runs")
    args = parser.parse_args()
    pretrained = dict(item.split("=", 1) for item in args.pretrained)
    load_before = load_now()
    table: dict[str, list[float]] = {}
    values: dict[str, float] = {}
    gaps_chosen, gaps_default = [], []
    for mode in ("standard", "aligned"):
        if mode in pretrained:
            run_dir = Path(pretrained[mode])
        else:
            seconds, run_dir = run(f"transfer/digits_vit_{mode}", args.out)
            values[f"{mode}_pretrain_seconds"] = round(seconds, 1)
            print(f"pretraining {mode}: {seconds:.0f} s, {run_dir}", flush=True)
        checkpoint = run_dir / "checkpoints" / "last.ckpt"
        overrides = (f"--model.init_args.checkpoint={checkpoint}",)
        seconds, probe_dir = run("transfer/digits_probe", args.out, overrides, name=f"probe_{mode}")
        state = torch.load(probe_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        decays = state["state_dict"]["weight_decay"].tolist()
        print(f"probes on {mode}: {seconds:.1f} s, weight decays {decays}, {probe_dir}", flush=True)
        start = time.perf_counter()
        chosen, default = references(checkpoint, decays)
        print(f"LogisticRegression references: {time.perf_counter() - start:.0f} s", flush=True)
        probe = last_summary(probe_dir)["accuracy"]
        table[f"{mode} clean 0-4"] = last_summary(run_dir)["accuracy"]
        table[f"{mode} corrupted 0-4"] = last_summary(run_dir, stage="val_corrupted")["accuracy"]
        table[f"{mode} probe 5-9"] = probe
        values[f"{mode}_probe_seconds"] = round(seconds, 1)
        for layer, (p, c, d, w) in enumerate(zip(probe, chosen, default, decays), 1):
            values[f"{mode}_probe_layer_{layer}"] = round(p, 4)
            values[f"{mode}_sklearn_chosen_c_layer_{layer}"] = round(c, 4)
            values[f"{mode}_sklearn_c1_layer_{layer}"] = round(d, 4)
            values[f"{mode}_weight_decay_layer_{layer}"] = w
        gaps_chosen.append(float(np.abs(np.array(probe) - np.array(chosen)).max()))
        gaps_default.append(float(np.abs(np.array(probe) - np.array(default)).max()))
        print(f"\n{mode}: | layer | probe | LogisticRegression(chosen C) | LogisticRegression(C=1) | weight decay |")
        for layer, (p, c, d, w) in enumerate(zip(probe, chosen, default, decays), 1):
            print(f"| {layer} | {p:.4f} | {c:.4f} | {d:.4f} | {w:.1e} |")
        print(f"largest |probe - LR(chosen C)| = {gaps_chosen[-1]:.4f}, |probe - LR(C=1)| = {gaps_default[-1]:.4f}\n")
    values["max_gap_chosen_c_points"] = round(100 * max(gaps_chosen), 2)
    values["max_gap_c1_points"] = round(100 * max(gaps_default), 2)
    print("| layer | " + " | ".join(table) + " |")
    print("|" + "---|" * (len(table) + 1))
    for index in range(len(next(iter(table.values())))):
        print(f"| {index + 1} | " + " | ".join(f"{column[index]:.4f}" for column in table.values()) + " |")
    record("probes", values, load_before)


if __name__ == "__main__":
    main()
