"""What neural collapse complete costs a validation: every NC quantity against NC1 alone and a plain validation.

Side by side in one run, rounds alternated, each configuration in its own ``Trainer`` (no logger, no figures, no
table), warmed up on one batch first (which builds the metric states); the time is the wall time of
``Trainer.validate`` (the epoch end's compute included), median over ``--repeats`` rounds:

- ``plain``: no callback;
- ``NC1``: ``NeuralCollapseMonitor()`` (the default: NC1 alone);
- ``NC1-NC3``: ``NeuralCollapseMonitor(complete=True)`` (CDNV, NC2, NC3 streamed: the head's final norm applied to
  every layer's rows, two more float64 states);
- ``NC1-NC4``: ``NeuralCollapseMonitor(complete=True, ncc=True)`` (NC4 from the buffered features: ``L·N·d`` in the
  features' dtype).

Two shapes: the quickstart ViT (d=64, L=6, 10 classes) on the digits validation split (360 samples, batch 64), and a
DeiT-S (``deit_small_patch16_224``: L=12, d=384, 1000 classes, random weights) on ``--deit-samples`` random 224x224
images with random labels among 1000 (batch 32; kept small for a 2-core CPU). Prints one Markdown table with the
ratios to ``plain`` and to ``NC1``, the seconds spent in the monitor's own ``update`` and ``results`` (the NC math;
the rest of a difference is Lightning logging the scalars, 6-12 per layer), and the machine, load and date.

    python benchmarks/nc_cost.py                        # ~4 min on 2 loaded CPU cores
    python benchmarks/nc_cost.py --repeats 5 --deit-samples 256 --device cuda
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
import warnings

import torch
from lightning.pytorch import Trainer, seed_everything
from torch.utils.data import DataLoader, Subset, TensorDataset

from layerwise.callbacks import NeuralCollapseMonitor
from layerwise.datamodules import DigitsDataModule
from layerwise.features import TimmViT
from layerwise.lightning_modules import Standard

QUICKSTART = dict(
    model_name="vit_tiny_patch16_224", img_size=8, patch_size=2, in_chans=1, embed_dim=64, depth=6, num_heads=4
)
DEIT_S = dict(model_name="deit_small_patch16_224")
CONFIGS = {
    "plain": None,
    "NC1": dict(),
    "NC1-NC3": dict(complete=True),
    "NC1-NC4": dict(complete=True, ncc=True),
}


def trainer(options: dict | None, device: str, root: str) -> Trainer:
    callbacks = [] if options is None else [NeuralCollapseMonitor(log_figures=False, print_table=False, **options)]
    return Trainer(
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
        default_root_dir=root,
    )


SPENT: dict[str, float] = {}  # seconds in the monitor's own update and results (its math), this validation


def _time_monitor() -> None:
    """Add the seconds of ``NeuralCollapseMonitor.update``/``results`` to SPENT (the rest is Lightning's logging)."""
    for name in ("update", "results"):
        original = getattr(NeuralCollapseMonitor, name)

        def timed(*args, _original=original, **kwargs):
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                SPENT["nc"] = SPENT.get("nc", 0.0) + time.perf_counter() - start

        setattr(NeuralCollapseMonitor, name, timed)


def measure(
    model: Standard, loader: DataLoader, repeats: int, device: str, root: str
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    first = DataLoader(Subset(loader.dataset, range(loader.batch_size)), batch_size=loader.batch_size)
    trainers = {name: trainer(options, device, os.path.join(root, name)) for name, options in CONFIGS.items()}
    for job in trainers.values():
        job.validate(model, first, verbose=False)
    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    own: dict[str, list[float]] = {name: [] for name in CONFIGS}
    for _ in range(repeats):
        for name, job in trainers.items():
            SPENT.clear()
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            job.validate(model, loader, verbose=False)
            if device == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
            own[name].append(SPENT.get("nc", 0.0))
    return times, own


def quickstart(device: str) -> tuple[Standard, DataLoader, str]:
    data = DigitsDataModule(batch_size=64)
    data.setup("validate")
    loader = data.val_dataloader()
    model = Standard(backbone=TimmViT(num_classes=10, **QUICKSTART)).to(device).eval()
    return model, loader, f"quickstart ViT (L=6, d=64, K=10), digits, N={len(loader.dataset)}, batch 64"


def deit_s(device: str, samples: int) -> tuple[Standard, DataLoader, str]:
    images = torch.randn(samples, 3, 224, 224)
    labels = torch.randint(0, 1000, (samples,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=32)
    model = Standard(backbone=TimmViT(num_classes=1000, **DEIT_S)).to(device).eval()
    present = labels.unique().numel()
    return model, loader, f"DeiT-S (L=12, d=384, K=1000; {present} present), random 224x224, N={samples}, batch 32"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--deit-samples", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cases", nargs="+", default=["quickstart", "deit_s"])
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    seed_everything(0, verbose=False)
    load = os.getloadavg()[0]
    root = os.path.join("/tmp", f"nc_cost_{os.getpid()}")
    rows = []
    _time_monitor()
    for case in args.cases:
        model, loader, title = (
            quickstart(args.device) if case == "quickstart" else deit_s(args.device, args.deit_samples)
        )
        times, own = measure(model, loader, args.repeats, args.device, root)
        medians = {name: statistics.median(values) for name, values in times.items()}
        for name, value in medians.items():
            spread = f"{min(times[name]):.3f}-{max(times[name]):.3f}"
            rows.append(
                f"| {title} | {name} | {value:.3f} ({spread}) | {value / medians['plain']:.3f}x | "
                f"{value / medians['NC1']:.3f}x | {statistics.median(own[name]):.3f} |"
            )
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"{platform.processor() or 'CPU'}"
    print(
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {device}, {os.cpu_count()} cores, "
        f"{torch.get_num_threads()} threads, load {load:.2f} before and {os.getloadavg()[0]:.2f} after, median of "
        f"{args.repeats} rounds\n"
    )
    print("| shape | configuration | validate s (min-max) | / plain | / NC1 | monitor's update + results s |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
