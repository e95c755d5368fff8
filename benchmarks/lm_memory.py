"""Peak memory and time of the vocabulary-scale head: layerwise's chunked losses and readout against a naive version.

A GPT-2-shaped model (random weights, built offline) with the real 50,257-token vocabulary. Every step is measured
in the same run, against the same backbone and batch:

- **(a) training step** (forward + backward, no optimizer): ``Standard`` (last layer), ``Aligned`` (every layer),
  ``Aligned(sampled_exits=1)``, and a naive aligned loss that applies the head to all layers at once, materialising
  the ``(L·N, V)`` logits (skipped when its estimated size does not fit in the available memory). The reference is
  the backbone's own forward + backward with no head at all (``features.sum()`` as the loss).
- **(b) analysis step** under ``no_grad``: ``module.layer_outputs(batch)`` (the chunked readout) and a naive readout
  of the ``(L, N, V)`` logits at once, against the plain forward pass without any head.

For each step: ``extra`` is the step's peak allocated bytes minus the reference's peak (exact, from the allocator:
see ``_memory.py``), ``largest`` the largest storage any op allocated, ``bound`` the documented bound (``_memory.py``
and ``benchmarks/README.md``), ``xnaive`` the extra bytes as a fraction of the naive version's. Times are medians
over ``--repeats`` rounds that run every step once, in turn, without any tracking; ``ratio`` is against ``Standard``
(training) and the plain forward (analysis).

    .venv/bin/python benchmarks/lm_memory.py                     # GPT-2 small: L=12, d=768, 12 heads, T=256, B=4
    .venv/bin/python benchmarks/lm_memory.py --small             # L=4, d=256, 4 heads, T=128, B=2
    .venv/bin/python benchmarks/lm_memory.py --chunk-size 256 --device cuda

Exit status 1 when a chunked step misses its bound.
"""

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.nn.functional as F
from _memory import FLOAT32, FLOAT64, MemoryTracker, TensorRecord, analysis_bound, training_bound

from layerwise.engines.readout import DEFAULT_CHUNK_SIZE
from layerwise.features import FEATURES, IGNORE_INDEX, TARGETS, HFCausalLM
from layerwise.lightning_modules import Aligned, LayerwiseModule, Standard
from layerwise.metrics import readout_from_logits

VOCAB = 50257
GPT2_SMALL = dict(layers=12, width=768, heads=12, seq=256, batch=4)
SMALL = dict(layers=4, width=256, heads=4, seq=128, batch=2)
NAIVE_MEMORY_SHARE = 0.6  # run a naive step only if its estimate is below this share of the available memory


@dataclass
class Step:
    """One side of the comparison: a callable that runs a step, its bound and what was measured."""

    name: str
    run: Callable[[], Any]
    reference: str
    bound: Optional[dict[str, int]] = None
    naive: Optional[str] = None
    skipped: str = ""
    tracked: Optional[MemoryTracker] = None
    seconds: list[float] = field(default_factory=list)


def build_backbone(args: argparse.Namespace) -> HFCausalLM:
    torch.manual_seed(0)
    config = dict(
        n_layer=args.layers,
        n_embd=args.width,
        n_head=args.heads,
        vocab_size=VOCAB,
        n_positions=max(1024, args.seq),
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    backbone = HFCausalLM(model_type="gpt2", config_overrides=config)
    assert (backbone.num_layers, backbone.embed_dim, backbone.vocab_size) == (args.layers, args.width, VOCAB)
    return backbone.to(args.device)


def training_step(module: LayerwiseModule, batch: dict, loss: Optional[Callable] = None) -> Callable[[], None]:
    """Forward and backward of the module's training loss (or of ``loss(module, samples)``), gradients dropped."""

    def run() -> None:
        module.zero_grad(set_to_none=True)
        outputs = module.samples(batch)
        (module.compute_loss(outputs) if loss is None else loss(module, outputs)).backward()
        module.zero_grad(set_to_none=True)

    return run


def backbone_only(module: LayerwiseModule, outputs: dict) -> torch.Tensor:
    """No head at all: gradients of ones flow into every layer's features."""
    return outputs[FEATURES].sum()


def naive_aligned(module: Aligned, outputs: dict) -> torch.Tensor:
    """The aligned loss with the head applied to all layers at once: ``(L·N, V)`` logits and log-probabilities."""
    features, targets = outputs[FEATURES], outputs[TARGETS]
    layers, rows = features.shape[:2]
    logits = module.backbone.head(features).float()
    losses = F.cross_entropy(logits.flatten(0, 1), targets.repeat(layers), reduction="none").view(layers, rows)
    per_layer = losses.sum(1) / (targets != IGNORE_INDEX).sum()
    return (module.layer_weights * per_layer).sum()


def analysis_step(module: LayerwiseModule, batch: dict) -> Callable[[], None]:
    def run() -> None:
        module.layer_outputs(batch)

    return run


def plain_forward(module: LayerwiseModule, batch: dict) -> Callable[[], None]:
    @torch.no_grad()
    def run() -> None:
        module.samples(batch)

    return run


def naive_analysis(module: LayerwiseModule, batch: dict) -> Callable[[], None]:
    """The readout of the ``(L, N, V)`` logits of every kept row at once (what a classifier's analysis does)."""

    @torch.no_grad()
    def run() -> None:
        outputs = module.samples(batch)
        keep = outputs[TARGETS] != IGNORE_INDEX
        readout_from_logits(module.backbone.head(outputs[FEATURES][:, keep]), outputs[TARGETS][keep])

    return run


def available_bytes(device: str) -> int:
    if device == "cuda":
        return torch.cuda.mem_get_info()[0]
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    return int(fields["MemAvailable"].split()[0]) * 1024


def measure(step: Step, device: str) -> None:
    """Track one run of the step (also its warm-up)."""
    with MemoryTracker(device) as tracked:
        step.run()
    step.tracked = tracked


def time_steps(steps: list[Step], repeats: int, device: str) -> None:
    """``repeats`` rounds, every step once per round, in turn, so that background load hits all of them alike."""
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(repeats):
        for step in steps:
            if step.skipped:
                continue
            synchronize()
            start = time.perf_counter()
            step.run()
            synchronize()
            step.seconds.append(time.perf_counter() - start)


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.0f}"


def _largest(record: Optional[TensorRecord]) -> str:
    return "-" if record is None else str(record)


def print_table(title: str, steps: list[Step], time_reference: str) -> bool:
    """One row per step; returns whether every bounded step kept its bound."""
    by_name = {step.name: step for step in steps}
    base_seconds = statistics.median(by_name[time_reference].seconds)
    print(f"\n{title}")
    header = (
        f"{'step':<28}{'peak MiB':>10}{'extra MiB':>11}{'bound MiB':>11}{'':>6}{'xnaive':>8}{'time s':>9}"
        f"{'ratio':>8}  largest allocation"
    )
    print(header)
    print("-" * (len(header) + 40))
    ok = True
    for step in steps:
        if step.skipped:
            print(f"{step.name:<28}  skipped: {step.skipped}")
            continue
        peak = step.tracked.peak_bytes
        extra = peak - by_name[step.reference].tracked.peak_bytes if step.reference != step.name else 0
        row = f"{step.name:<28}{_mib(peak):>10}{_mib(extra) if step.reference != step.name else '':>11}"
        if step.bound is None:
            row += f"{'':>11}{'':>6}"
        else:
            bound = sum(step.bound.values())
            passed = extra <= bound
            ok &= passed
            row += f"{_mib(bound):>11}{'PASS' if passed else 'FAIL':>6}"
        naive = by_name.get(step.naive) if step.naive else None
        if naive is not None and not naive.skipped:
            naive_extra = naive.tracked.peak_bytes - by_name[naive.reference].tracked.peak_bytes
            row += f"{extra / naive_extra:>8.3f}"
        else:
            row += f"{'':>8}"
        seconds = statistics.median(step.seconds)
        row += f"{seconds:>9.2f}{seconds / base_seconds:>7.2f}x  {_largest(step.tracked.largest_new)}"
        print(row)
    return ok


def print_bound(name: str, terms: dict[str, int]) -> None:
    parts = ", ".join(f"{term} {_mib(value)}" for term, value in terms.items())
    print(f"  {name} bound {_mib(sum(terms.values()))} MiB = {parts}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="L=4, d=256, 4 heads, T=128, B=2 (a quick run)")
    for name, default in GPT2_SMALL.items():
        parser.add_argument(f"--{name}", type=int, default=None, help=f"default {default} (--small: {SMALL[name]})")
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="rows per chunk of the head")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda if available")
    parser.add_argument("--repeats", type=int, default=1, help="timing rounds (medians over these)")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive materialising steps")
    args = parser.parse_args()
    for name, value in (SMALL if args.small else GPT2_SMALL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    warnings.filterwarnings("ignore", ".*does not have many workers.*")

    backbone = build_backbone(args)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, VOCAB, (args.batch, args.seq), generator=generator).to(args.device)
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    chunk = args.chunk_size
    standard = Standard(backbone, chunk_size=chunk)
    aligned = Aligned(backbone, chunk_size=chunk)
    sampled = Aligned(backbone, sampled_exits=1, chunk_size=chunk)

    layers, width = args.layers, args.width
    train_rows = args.batch * args.seq  # every position is a row; the last one's target is -100
    eval_rows = args.batch * (args.seq - 1)
    train = training_bound(VOCAB, width, layers, train_rows, chunk)
    analysis = analysis_bound(VOCAB, width, layers, eval_rows, chunk)
    naive_train = 4 * layers * train_rows * VOCAB * FLOAT32  # logits, log-softmax, their two gradients
    naive_eval = layers * eval_rows * VOCAB * (FLOAT32 + FLOAT64 + FLOAT64)
    available = available_bytes(args.device)

    def naive_skip(estimate: int) -> str:
        if args.no_naive:
            return "--no-naive"
        if estimate > NAIVE_MEMORY_SHARE * available:
            return (
                f"needs ~{_mib(estimate)} MiB, more than {NAIVE_MEMORY_SHARE:.0%} of the {_mib(available)} MiB "
                "available"
            )
        return ""

    no_head, forward = "backbone only (no head)", "plain forward (no head)"
    training = [
        Step(no_head, training_step(standard, batch, backbone_only), no_head),
        Step("Standard", training_step(standard, batch), no_head, train, "naive aligned"),
        Step("Aligned (all layers)", training_step(aligned, batch), no_head, train, "naive aligned"),
        Step("Aligned(sampled_exits=1)", training_step(sampled, batch), no_head, train, "naive aligned"),
        Step("naive aligned", training_step(aligned, batch, naive_aligned), no_head, skipped=naive_skip(naive_train)),
    ]
    evaluation = [
        Step(forward, plain_forward(standard, batch), forward),
        Step("layer_outputs", analysis_step(standard, batch), forward, analysis, "naive readout"),
        Step("naive readout", naive_analysis(standard, batch), forward, skipped=naive_skip(naive_eval)),
    ]

    gpu = f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"{torch.get_num_threads()} torch threads, device {args.device}{gpu}, {_mib(available)} MiB available"
    )
    print(
        f"GPT-2 shape: L={layers}, d={width}, {args.heads} heads, V={VOCAB}, T={args.seq}, B={args.batch}: "
        f"N={train_rows} rows in training ({eval_rows} kept in the analysis), chunk_size={chunk}; "
        f"{sum(p.numel() for p in backbone.parameters()):,} parameters"
    )
    print_bound("training", train)
    print_bound("analysis", analysis)
    print(f"  one layer's chunk of float32 logits: {_mib(min(chunk, train_rows) * VOCAB * FLOAT32)} MiB")
    print(f"  the full (L, N, V) float32 logits: {_mib(layers * train_rows * VOCAB * FLOAT32)} MiB")

    for step in training:
        if not step.skipped:
            measure(step, args.device)
    for step in evaluation:
        if not step.skipped:
            measure(step, args.device)
    time_steps(training + evaluation, args.repeats, args.device)

    rounds = f"median of {args.repeats} round(s)"
    ok = print_table(f"(a) training step (forward + backward), {args.device}, {rounds}", training, "Standard")
    ok &= print_table(f"(b) analysis step (no_grad), {args.device}, {rounds}", evaluation, forward)
    print(
        "\nextra = peak minus the reference's peak (allocator bytes); bound = documented bound; xnaive = extra / the "
        "naive step's extra; ratio = time / Standard's (a) or the plain forward's (b)."
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
