"""Training step time and peak memory of ``Aligned`` against ``Standard`` on a DeiT-S-shaped ViT, side by side.

A DeiT-S-shaped ViT (``deit_small_patch16_224``: d=384, L=12, 6 heads; random weights, built offline) through
``layerwise.features.TimmViT``, with 10 and with 1,000 classes. For each class count, ``Standard`` (last-layer
cross-entropy) and ``Aligned`` (the shared head at all 12 layers, linear weights) start from the same weights and run
the full training step: ``training_step`` (forward, loss, the last layer's accuracy), ``backward``, ``AdamW.step`` and
``zero_grad``, without a Trainer (the Trainer's own per-step cost would be the same for both).

- **time**: every variant takes ``--warmup`` steps (which also allocate AdamW's states), then ``--repeats`` rounds run
  every variant once, in turn (the order reversed every other round), so that background load hits all of them
  alike. Medians over the rounds of the wall-clock time and of the process CPU time (``time.process_time``, all
  threads: with one intra-op thread it counts only the cycles the step got, so other jobs on the cores inflate it far
  less than the wall time); ``ratio`` is Aligned's median over Standard's, ``paired`` the median of the per-round
  wall-time ratios (each from two adjacent steps).
- **loss alone**: both strategies run the same backbone; only ``compute_loss`` differs (the shared head at 1 or 12
  layers). After its step in every round, each variant also times ``--loss-repeats`` calls of its loss + backward
  from the step's detached layer features. ``est.`` = 1 + (Aligned's loss - Standard's) / Standard's step (CPU
  medians): the step ratio measured through the part that differs, which stays readable when other jobs make the
  step times jump by more than the difference.
- **peak memory**: one more step of every variant under ``benchmarks/_memory.py``'s ``MemoryTracker``: the peak bytes
  allocated above the level at the start of the step (parameters and optimizer states excluded; activations, saved
  tensors, gradients and the optimizer's temporaries included). Exact on CPU (the allocator's events) and from
  ``torch.cuda.max_memory_allocated`` on CUDA.

    .venv/bin/python benchmarks/step_time.py                          # 224x224, patch 16, batch 8; ~3 min on 2 cores
    .venv/bin/python benchmarks/step_time.py --threads 1 --repeats 9  # one intra-op thread (a shared machine)
    .venv/bin/python benchmarks/step_time.py --quick                  # 64x64 images, batch 4, 2 rounds: a smoke run
    .venv/bin/python benchmarks/step_time.py --device cuda --batch 64 --repeats 20
"""

import argparse
import copy
import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import torch
from _memory import MemoryTracker

from layerwise.features import FEATURES, TARGETS, TimmViT
from layerwise.lightning_modules import Aligned, LayerwiseModule, Standard

MODEL = "deit_small_patch16_224"


@dataclass
class Variant:
    """One side of the comparison: a module, its optimizer, one batch and that batch's (detached) layer features."""

    name: str
    classes: int
    module: LayerwiseModule
    batch: tuple[torch.Tensor, torch.Tensor]
    optimizer: Optional[torch.optim.Optimizer] = None
    features: Optional[torch.Tensor] = None
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    loss_seconds: list[float] = field(default_factory=list)
    loss_cpu_seconds: list[float] = field(default_factory=list)
    peak_bytes: int = 0

    def step(self) -> None:
        """One full training step: forward and loss, backward, optimizer step, gradients dropped."""
        loss = self.module.training_step(self.batch, 0)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def loss_only(self) -> None:
        """The strategy's loss and its backward from the step's layer features: the only part that differs."""
        features = self.features.detach().requires_grad_()
        self.module.compute_loss({FEATURES: features, TARGETS: self.batch[1]}).backward()
        self.optimizer.zero_grad(set_to_none=True)


def build_variants(args: argparse.Namespace) -> list[Variant]:
    """Standard and Aligned for every class count, from the same random weights, on the same random batch."""
    variants = []
    for classes in args.classes:
        torch.manual_seed(0)
        backbone = TimmViT(MODEL, num_classes=classes, img_size=args.img_size, patch_size=args.patch_size)
        assert (backbone.num_layers, backbone.embed_dim, backbone.num_classes) == (12, 384, classes)
        generator = torch.Generator().manual_seed(0)
        images = torch.randn(args.batch, 3, args.img_size, args.img_size, generator=generator)
        labels = torch.randint(0, classes, (args.batch,), generator=generator)
        batch = (images.to(args.device), labels.to(args.device))
        for name, strategy in (("Standard", Standard), ("Aligned", Aligned)):
            module = strategy(copy.deepcopy(backbone)).to(args.device).train()
            variant = Variant(name, classes, module, batch)
            variant.optimizer = module.configure_optimizers()
            with torch.no_grad():
                variant.features = module.samples(batch)[FEATURES]
            variants.append(variant)
    return variants


def _timed(action: Callable[[], None], synchronize: Callable[[], None]) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of one call."""
    synchronize()
    start, cpu_start = time.perf_counter(), time.process_time()
    action()
    synchronize()
    return time.perf_counter() - start, time.process_time() - cpu_start


def measure(variants: list[Variant], args: argparse.Namespace) -> None:
    """Warm-up steps, one tracked step each, then ``repeats`` timed rounds, every variant once per round.

    Every round also times the loss alone ``loss_repeats`` times per variant, right after its step.
    """
    synchronize: Callable[[], None] = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for variant in variants:
        for _ in range(args.warmup):
            variant.step()
            variant.loss_only()
        with MemoryTracker(args.device) as tracked:
            variant.step()
        variant.peak_bytes = tracked.peak_bytes
    for round_index in range(args.repeats):
        for variant in variants if round_index % 2 == 0 else reversed(variants):
            wall, cpu = _timed(variant.step, synchronize)
            variant.seconds.append(wall)
            variant.cpu_seconds.append(cpu)
            for _ in range(args.loss_repeats):
                wall, cpu = _timed(variant.loss_only, synchronize)
                variant.loss_seconds.append(wall)
                variant.loss_cpu_seconds.append(cpu)


def _median_ratio(numerators: list[float], denominators: list[float]) -> float:
    """Median of the per-round ratios (each from two steps run next to each other)."""
    return statistics.median(a / b for a, b in zip(numerators, denominators))


def print_table(variants: list[Variant], args: argparse.Namespace) -> None:
    print(
        f"\nTraining step (forward + backward + AdamW step), {args.device}, batch {args.batch}, "
        f"{args.img_size}x{args.img_size} images, patch {args.patch_size}; median of {args.repeats} rounds "
        f"(loss alone: of {args.repeats * args.loss_repeats} calls)"
    )
    header = (
        f"{'classes':>8}  {'module':<10}{'step s':>9}{'(min-max)':>15}{'ratio':>8}{'paired':>8}"
        f"{'CPU s':>8}{'ratio':>8}{'loss ms':>9}{'CPU ms':>8}{'est.':>8}{'peak MiB':>10}{'ratio':>8}"
    )
    print(header)
    print("-" * len(header))
    for standard, aligned in zip(variants[0::2], variants[1::2]):
        base, cpu_base = statistics.median(standard.seconds), statistics.median(standard.cpu_seconds)
        loss_base = statistics.median(standard.loss_cpu_seconds)
        for variant in (standard, aligned):
            seconds, cpu = statistics.median(variant.seconds), statistics.median(variant.cpu_seconds)
            loss, loss_cpu = statistics.median(variant.loss_seconds), statistics.median(variant.loss_cpu_seconds)
            spread = f"({min(variant.seconds):.2f}-{max(variant.seconds):.2f})"
            paired = f"{_median_ratio(aligned.seconds, standard.seconds):.3f}x" if variant is aligned else ""
            row = f"{variant.classes:>8}  {variant.name:<10}{seconds:>9.3f}{spread:>15}{seconds / base:>7.3f}x"
            row += f"{paired:>8}{cpu:>8.2f}{cpu / cpu_base:>7.3f}x{1e3 * loss:>9.2f}{1e3 * loss_cpu:>8.2f}"
            row += f"{1 + (loss_cpu - loss_base) / cpu_base:>7.3f}x"
            row += f"{variant.peak_bytes / 2**20:>10.1f}{variant.peak_bytes / standard.peak_bytes:>7.3f}x"
            print(row)
    print(
        "\nratio = Aligned / Standard: medians of the wall-clock step, of the process CPU time (all threads; with one "
        "thread less sensitive to other jobs than the wall time) and the peak memory; paired = median of the "
        "per-round wall-time ratios. loss = the strategy's loss + backward alone, from the step's features (wall, "
        "CPU); est. = 1 + (Aligned's loss CPU - Standard's) / Standard's step CPU: the ratio the two steps would have "
        "without noise, since the loss is all that differs. peak = bytes allocated above the start of the step "
        "(parameters and AdamW states excluded)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, nargs="+", default=[10, 1000], help="class counts to compare")
    parser.add_argument("--img-size", type=int, default=224, help="image side (DeiT-S: 224)")
    parser.add_argument("--patch-size", type=int, default=16, help="patch side (DeiT-S: 16)")
    parser.add_argument("--batch", type=int, default=8, help="images per step")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (medians over these)")
    parser.add_argument("--loss-repeats", type=int, default=10, help="timed calls of the loss alone per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per variant before measuring")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda if available")
    parser.add_argument("--quick", action="store_true", help="64x64 images, batch 4, 1 warm-up step, 2 rounds")
    args = parser.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.quick:
        args.img_size, args.batch, args.warmup, args.repeats = 64, 4, 1, 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", ".*self.log.*")  # training_step logs; without a Trainer that is a no-op
    gpu = f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"{torch.get_num_threads()} torch threads, device {args.device}{gpu}"
    )
    print(f"{MODEL} shape: L=12, d=384, 6 heads; classes {args.classes}; Aligned with linear layer weights")
    variants = build_variants(args)
    measure(variants, args)
    print_table(variants, args)


if __name__ == "__main__":
    main()
