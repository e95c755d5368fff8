"""Early exit that saves time: the measured wall-clock speedup next to the paper's layer-count speedup.

For batch sizes 1, 32 and 256 (``--batch-sizes``), :func:`layerwise.engines.early_exit.measure_speedup` times batched
early exit (samples that meet the criterion leave the batch; the rest run on) against the full model on the same
batches,
and the table shows the layer-count speedup ``Σ L·m_l / Σ l·m_l``, the measured speedup (full wall time / early-exit
wall time, fastest of ``--repeats`` alternating passes after one warm-up pass) and their ratio. The target: at batch
256 the measured speedup reaches at least 80 % of the layer-count speedup.

Two cases:

- ``quickstart``: the quickstart model (``configs/quickstart.yaml``: timm ViT, 6 blocks, width 64, patch 2 over
  8x8 digits, mean pooling), trained here for ``--steps`` optimizer steps with the config's strategy, optimizer and
  data (or loaded from ``--checkpoint``), on the 360-image digits validation split in batches of b (at b = 256:
  256 + 104). Exit at ``--threshold`` (default 0.8: the config's label smoothing 0.1 keeps the top-1 probability
  below ~0.91, so 0.9 is almost never reached). The table adds the accuracy of the early-exit predictions.
- ``deit_s``: a DeiT-S-sized ViT (``deit_small_patch16_224``: 12 blocks, width 384, 6 heads, patch 16, class-token
  pooling, 1000 classes) with random weights on random images. Random weights give a shared head with near-uniform
  softmax outputs, so the head is made sharper (its weights redrawn with standard deviation ``--head-std``, so that
  the top-1 probability varies from layer to layer and sample to sample) and the threshold is *chosen*: bisection
  over τ on the full model's per-layer confidences of the ``--num-samples`` images, so that the layer-count speedup
  there is ``--target-speedup`` (default 2.0); the exits per layer are printed. Images are ``--img-size`` pixels
  (default 64: 16 patches + the class token = 17 tokens per image; 224 gives DeiT-S's 197 tokens, ~10x slower),
  because a full 224-pixel pass over 256 images takes ~25 s on 2 CPU cores. Batch 1 times the first
  ``--batch1-samples`` images (default 32), batches 32 and 256 all of them.

Threads: one by default (``--threads``; 0 keeps torch's choice). On a 2-core machine shared with other jobs, two
OpenMP threads made the small model 30-100x slower and the timings meaningless; with one thread both sides run the
same way. More threads (or a GPU) run small batches less efficiently, which lowers the measured speedup of the late,
thinned-out blocks. The script prints the load average; on a shared machine the ratios (both sides measured in
alternation) are the figures to trust, not the absolute times. Exit status 0 when the target holds, 1 otherwise.

    .venv/bin/python benchmarks/early_exit.py                          # both cases, ~2.5 minutes on 2 CPU cores
    .venv/bin/python benchmarks/early_exit.py --case deit_s --img-size 224 --device cuda --threads 0
    .venv/bin/python benchmarks/early_exit.py --case quickstart --checkpoint last.ckpt --threshold 0.9
"""

import argparse
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.pytorch import Trainer, seed_everything

from layerwise.cli import LayerwiseCLI
from layerwise.engines.early_exit import EarlyExitResult, layer_count_speedup, measure_speedup
from layerwise.features import Backbone, TimmViT

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "quickstart.yaml"
TARGET_RATIO = 0.8


def quickstart_case(args: argparse.Namespace) -> tuple[Backbone, torch.Tensor, Optional[torch.Tensor], dict]:
    """The quickstart backbone (trained for ``--steps`` or loaded), the digits validation images and labels."""
    cli = LayerwiseCLI(args=["--config", str(QUICKSTART), "--data.init_args.num_workers=0"], run=False)
    module, data = cli.model, cli.datamodule
    if args.checkpoint:
        module.load_state_dict(torch.load(args.checkpoint, map_location="cpu", weights_only=False)["state_dict"])
        print(f"quickstart: loaded {args.checkpoint}")
    else:
        start = time.perf_counter()
        trainer = Trainer(
            max_steps=args.steps,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
            num_sanity_val_steps=0,
        )
        trainer.fit(module, data)
        print(f"quickstart: trained {args.steps} steps in {time.perf_counter() - start:.1f} s")
    data.setup("predict")
    images, labels = data.val_set.tensors
    backbone = module.backbone.eval().to(args.device)
    with torch.no_grad():
        last = backbone.head(backbone(images.to(args.device))[-1]).argmax(-1).cpu()
    print(f"quickstart: last-layer validation accuracy {(last == labels).double().mean():.4f}")
    return backbone, images.to(args.device), labels, {"threshold": args.threshold}


def deit_case(args: argparse.Namespace) -> tuple[Backbone, torch.Tensor, Optional[torch.Tensor], dict]:
    """A random DeiT-S-sized ViT with a sharpened head, random images, and the threshold chosen by bisection."""
    torch.manual_seed(0)
    backbone = TimmViT("deit_small_patch16_224", num_classes=1000, img_size=args.img_size).eval().to(args.device)
    assert (backbone.num_layers, backbone.embed_dim) == (12, 384)
    with torch.no_grad():
        backbone.model.head.weight.normal_(0.0, args.head_std)
    images = torch.randn(args.num_samples, 3, args.img_size, args.img_size, device=args.device)
    with torch.no_grad():
        confidence = torch.cat(
            [torch.softmax(backbone.head(backbone(chunk)).double(), -1).amax(-1) for chunk in images.split(64)], dim=1
        )  # (L, N)
    tau = choose_threshold(confidence, args.target_speedup)
    print(
        f"deit_s: {backbone.num_layers} x {backbone.embed_dim}, {backbone.model.patch_embed.num_patches + 1} tokens "
        f"per image; head std {args.head_std}: top-1 probability {confidence.min():.3f}-{confidence.max():.3f}; "
        f"τ = {tau:.6f} chosen for a layer-count speedup of {args.target_speedup} on {args.num_samples} images"
    )
    return backbone, images, None, {"threshold": tau}


def threshold_exits(confidence: torch.Tensor, tau: float) -> torch.Tensor:
    """1-based exit layers ``(N,)`` from the per-layer confidences ``(L, N)`` (the analysis' definition)."""
    exits = confidence >= tau
    exits[-1] = True
    return exits.double().argmax(0) + 1


def choose_threshold(confidence: torch.Tensor, target: float, steps: int = 60) -> float:
    """The τ whose layer-count speedup is closest to ``target`` (speedup falls as τ rises: bisection)."""
    low, high = 0.0, 1.0
    for _ in range(steps):
        middle = (low + high) / 2
        if layer_count_speedup(threshold_exits(confidence, middle), confidence.shape[0]) > target:
            low = middle
        else:
            high = middle
    return high


def run_case(
    name: str, backbone: Backbone, images: torch.Tensor, labels: Optional[torch.Tensor], criterion: dict, args: Any
) -> list[tuple[str, int, EarlyExitResult]]:
    """Measure every batch size; print the table rows and return them."""
    print(f"\n{name}: early exit {criterion}, fastest of {args.repeats} passes per side")
    print(
        "| case | batch | samples | layer-count | measured | measured / layer-count | full s | early-exit s |", end=""
    )
    print(" exits per layer 1..L | accuracy at exit |\n" + "| --- " * 10 + "|")
    rows = []
    for batch_size in args.batch_sizes:
        count = min(len(images), args.batch1_samples) if batch_size == 1 and name == "deit_s" else len(images)
        result = measure_speedup(
            backbone, list(images[:count].split(batch_size)), **criterion, repeats=args.repeats, warmup=1
        )
        accuracy = "n/a" if labels is None else f"{(result.predictions.cpu() == labels[:count]).double().mean():.4f}"
        print(
            f"| {name} | {batch_size} | {count} | {result.layer_count_speedup:.2f}x | {result.measured_speedup:.2f}x | "
            f"{100 * result.measured_speedup / result.layer_count_speedup:.0f} % | {result.full_seconds:.3f} | "
            f"{result.early_exit_seconds:.3f} | {' '.join(map(str, result.exit_counts.tolist()))} | {accuracy} |",
            flush=True,
        )
        rows.append((name, batch_size, result))
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=["quickstart", "deit_s", "both"], default="both")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per side (fastest is reported)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's own choice)")
    parser.add_argument("--steps", type=int, default=300, help="quickstart: optimizer steps of training")
    parser.add_argument("--checkpoint", help="quickstart: a checkpoint to load instead of training")
    parser.add_argument("--threshold", type=float, default=0.8, help="quickstart: exit threshold τ")
    parser.add_argument("--img-size", type=int, default=64, help="deit_s: image size (224 = real DeiT-S)")
    parser.add_argument("--num-samples", type=int, default=256, help="deit_s: random images")
    parser.add_argument("--batch1-samples", type=int, default=32, help="deit_s: images timed at batch size 1")
    parser.add_argument("--head-std", type=float, default=0.2, help="deit_s: std of the sharpened head weights")
    parser.add_argument("--target-speedup", type=float, default=2.0, help="deit_s: layer-count speedup to aim τ at")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    seed_everything(0, verbose=False)
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("n/a",) * 3
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, "
        f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in load)}"
    )
    cases = ["quickstart", "deit_s"] if args.case == "both" else [args.case]
    rows = []
    for name in cases:
        backbone, images, labels, criterion = (quickstart_case if name == "quickstart" else deit_case)(args)
        rows += run_case(name, backbone, images, labels, criterion, args)
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("n/a",) * 3
    print(f"\nload average at the end {' '.join(f'{x:.2f}' for x in load)}")
    largest = [row for row in rows if row[1] == max(args.batch_sizes)]
    ok = all(r.measured_speedup >= TARGET_RATIO * r.layer_count_speedup for *_, r in largest)
    verdict = "met" if ok else "MISSED"
    print(f"target (measured >= {TARGET_RATIO:.0%} of layer-count at batch {max(args.batch_sizes)}): {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
