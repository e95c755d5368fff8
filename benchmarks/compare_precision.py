"""Cross-model CKA, exact against fast (issue 24.3): time per batch beside the two plain forwards, and the error.

Two random GPT-2-small-shaped base models (12 x 768; ``layerwise compare`` loads base models, no LM head) read the
same batches of random token ids, held on the host as the command's loader yields them (``input_ids`` and an
all-ones ``attention_mask``, pinned on a GPU). Three variants alternate in one process, ``--repeats`` times each:

- ``plain``: A's and B's forwards alone, no hooks, the ids copied to the device, without a KV cache
  (``use_cache=False``) and without the all-ones mask, as ``compare_models`` runs them;
- ``exact``: ``compare_models(..., precision="exact")``: hooked forwards + every product in float64;
- ``fast``: ``compare_models(..., precision="fast")``: each batch's products in float32 around the float64 shift,
  summed into the same float64 states;
- ``fast_inline`` (on a GPU only): the same, with the updates run on the forwards' stream instead of the side stream
  of ``UpdateStream`` (as before 744bb3e), so the side stream's gain is measured in the same run.

On a GPU each variant runs twice per repeat, over all ``--batches`` batches and over the first half of them, with
the device synchronised only at the end of each run (as a user's loop would be); the cost of a further batch is the
difference of the two times over the difference of the batch counts. So the first batch (which allocates the
793 MiB of states) and the final ``compute`` cancel out, and work the device overlaps with the host's (a batch's
products queued while the host launches the next forwards) counts once, as it costs a user. On a CPU, where nothing
overlaps, every batch is timed on its own (a comparison's from one update to the next, the first left out), which
is the same cost with less noise. Medians over all of them. On a GPU a second estimate is printed and recorded
(``interval_ratio``): in each long run, the mean host time between consecutive batches, from the first batch's
progress call to the last's (never synchronised; the first batch and ``compute`` left out without subtracting a
second run), medians over the repeats, against the plain forwards'. A Hugging Face forward waits on the device once
(transformers 5's packed-sequence check), so the host keeps the device's pace. On lent H100s and H200s a whole run's
per-batch time moved by up to 2x from one run to the next, which the difference of two runs doubles. The "of
which" rows time one batch part by part,
synchronised between parts: on a GPU they add up to more than the overlapped whole. The error is the largest
absolute difference between the fast and the exact CKA matrices (every layer pair) of the same comparison.

    python benchmarks/compare_precision.py --device cpu --batch 2 --tokens 256 --batches 4 --repeats 3

On a GPU, ``--matmul-precision high`` runs the whole process as a user who follows Lightning's advice
(``torch.set_float32_matmul_precision("high")``) would: float32 products on TF32 tensor cores, the forwards and the
fast mode's products alike; ``--dtype bfloat16`` runs both models in bfloat16. Each variant is recorded under its own
name (``compare_precision``, ``..._tf32``, ``..._bf16_tf32``), with the machine kind after it on a GPU
(``compare_precision_tf32_cuda_h200``).
"""

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import load_now, record  # noqa: E402

from layerwise.engines import compare as compare_module  # noqa: E402
from layerwise.engines.compare import UpdateStream, compare_models, hidden_states, token_features  # noqa: E402
from layerwise.features.paths import get_blocks, layer_paths  # noqa: E402
from layerwise.metrics.compare import CrossModelCKA  # noqa: E402

hf_logging.set_verbosity_error()


def build(args: argparse.Namespace, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = AutoConfig.for_model("gpt2", n_layer=args.layers, n_embd=args.dim, n_head=args.heads, vocab_size=50257)
    model = AutoModelForCausalLM.from_config(config).base_model
    return model.to(args.device, getattr(torch, args.dtype)).eval()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--batches", type=int, default=4, help="batches of the longer run (>= 2; the shorter has half)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the models' dtype")
    parser.add_argument(
        "--matmul-precision",
        choices=["highest", "high"],
        default="highest",
        help="torch.set_float32_matmul_precision for the whole run (high: TF32 on a GPU)",
    )
    args = parser.parse_args()
    torch.set_float32_matmul_precision(args.matmul_precision)
    load_before = load_now()
    a, b = build(args, 0), build(args, 1)
    generator = torch.Generator().manual_seed(2)
    pin = args.device.startswith("cuda")
    batches = []
    for _ in range(max(2, args.batches)):
        ids = torch.randint(0, 50257, (args.batch, args.tokens), generator=generator)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        batches.append({key: value.pin_memory() if pin else value for key, value in batch.items()})
    halves = (batches, batches[: len(batches) // 2])
    on_cpu = args.device == "cpu"  # nothing asynchronous: every batch is timed on its own
    further = len(batches) - len(halves[1])

    def plain(part: list) -> tuple[float, list[float]]:
        """The whole run's time, and each batch's (meaningful on a CPU, where nothing runs asynchronously)."""
        stamps = [time.perf_counter()]
        sync(args.device)
        start = time.perf_counter()
        with torch.no_grad():
            for batch in part:
                ids = batch["input_ids"].to(args.device, non_blocking=True)
                a(input_ids=ids, use_cache=False)
                b(input_ids=ids, use_cache=False)
                stamps.append(time.perf_counter())
        sync(args.device)
        return time.perf_counter() - start, [later - earlier for earlier, later in zip(stamps, stamps[1:])]

    def comparison(precision: str, part: list) -> tuple[float, list[float], torch.Tensor]:
        """The whole run's time, the time between consecutive batches' updates (the first left out), and the CKA."""
        stamps: list[float] = []
        inline = precision.endswith("_inline")  # updates on the forwards' stream: an UpdateStream that has none
        on_host = mock.patch.object(compare_module, "UpdateStream", lambda device: UpdateStream(torch.device("cpu")))
        sync(args.device)
        start = time.perf_counter()
        with on_host if inline else contextlib.nullcontext():
            results = compare_models(
                a,
                b,
                part,
                precision=precision.removesuffix("_inline"),
                progress=lambda _: stamps.append(time.perf_counter()),
            )
        sync(args.device)
        return (
            time.perf_counter() - start,
            [later - earlier for earlier, later in zip(stamps, stamps[1:])],
            results["cka"],
        )

    blocks = [get_blocks(model, layer_paths(model)) for model in (a, b)]

    def stages() -> dict[str, float]:
        """One further batch of a comparison, part by part: the hooked forwards, then each precision's update."""
        batch, out = {"input_ids": batches[-1]["input_ids"].to(args.device)}, {}
        sync(args.device)
        start = time.perf_counter()
        features = [token_features(hidden_states(m, k, (), batch, False), None) for m, k in zip((a, b), blocks)]
        sync(args.device)
        out["hooked"] = time.perf_counter() - start
        for precision in ("exact", "fast"):
            metric = CrossModelCKA(args.layers, args.dim, args.layers, args.dim, precision=precision).to(args.device)
            metric.update(*features)  # the first update sets the shift and allocates nothing new after
            sync(args.device)
            start = time.perf_counter()
            metric.update(*features)
            sync(args.device)
            out[f"update_{precision}"] = time.perf_counter() - start
            del metric
        return out

    plain(halves[1])  # warm-up
    stages()
    variants = ("exact", "fast") if on_cpu else ("exact", "fast", "fast_inline")
    times: dict[str, list[float]] = {"plain": [], **{name: [] for name in variants}}
    intervals: dict[str, list[float]] = {name: [] for name in times}  # mean time between batches, one per run
    parts: dict[str, list[float]] = {"hooked": [], "update_exact": [], "update_fast": []}
    errors = []
    for _ in range(args.repeats):
        whole, each = plain(halves[0])
        times["plain"] += each if on_cpu else [(whole - plain(halves[1])[0]) / further]
        intervals["plain"].append(statistics.fmean(each[1:]))
        runs = {}
        for precision in variants:
            whole, each, runs[precision] = comparison(precision, halves[0])
            times[precision] += each if on_cpu else [(whole - comparison(precision, halves[1])[0]) / further]
            intervals[precision].append(statistics.fmean(each))
        errors.append(float((runs["fast"] - runs["exact"]).abs().max()))
        for key, value in stages().items():
            parts[key].append(value)
    medians = {name: statistics.median(values) for name, values in times.items()}
    tokens = args.batch * args.tokens
    print(
        f"\n{args.layers} x {args.dim} models ({args.dtype}, float32 matmul precision {args.matmul_precision!r}), "
        f"{tokens} tokens per batch, {args.device}, medians of {args.repeats}"
    )
    print(f"{'per batch':<58}{'s':>9}{'ratio':>9}")
    rows = {
        "plain": "A and B forward, no hooks",
        "exact": 'compare_models precision="exact", each further batch',
        "fast": 'compare_models precision="fast", each further batch',
        "fast_inline": "  the same, its updates on the forwards' stream (before 744bb3e)",
    }
    for name, label in rows.items():
        if name not in medians:
            continue
        print(f"{label:<58}{medians[name]:>9.4f}{medians[name] / medians['plain']:>8.2f}x")
    for name, label in {
        "hooked": "  of which: A and B forward with the block hooks",
        "update_exact": '  of which: CrossModelCKA.update, precision="exact"',
        "update_fast": '  of which: CrossModelCKA.update, precision="fast"',
    }.items():
        value = statistics.median(parts[name])
        print(f"{label:<58}{value:>9.4f}{value / medians['plain']:>8.2f}x")
    interval_ratios = {}
    if not on_cpu:  # a second estimate, steadier where the device's pace jumps from run to run
        base = statistics.median(intervals["plain"])
        for name in variants:
            interval_ratios[name] = round(statistics.median(intervals[name]) / base, 3)
        print(
            f"per run, the mean time between consecutive batches (first to last, never synchronised; medians of "
            f"{len(intervals['plain'])}), against the plain forwards': "
            + ", ".join(f"{name} {ratio:.2f}x" for name, ratio in interval_ratios.items())
        )
    print(f"largest |CKA fast - CKA exact| over every layer pair and repeat: {max(errors):.2e}")
    values = {
        "shape": f"{args.layers}x{args.dim}",
        "tokens_per_batch": tokens,
        "device": args.device,
        "dtype": args.dtype,
        "matmul_precision": args.matmul_precision,
        "plain_s": round(medians["plain"], 4),
        "exact_s": round(medians["exact"], 4),
        "fast_s": round(medians["fast"], 4),
        "exact_ratio": round(medians["exact"] / medians["plain"], 2),
        "fast_ratio": round(medians["fast"] / medians["plain"], 2),
        **(
            {}
            if on_cpu
            else {
                "fast_inline_s": round(medians["fast_inline"], 4),
                "fast_inline_ratio": round(medians["fast_inline"] / medians["plain"], 2),
            }
        ),
        "hooked_forwards_s": round(statistics.median(parts["hooked"]), 4),
        "update_exact_s": round(statistics.median(parts["update_exact"]), 4),
        "update_fast_s": round(statistics.median(parts["update_fast"]), 4),
        "fast_max_abs_error": float(f"{max(errors):.2e}"),
        "fast_max_abs_error_1e9": round(max(errors) * 1e9, 2),  # in units of 1e-9, for README's claim markers
        "repeats": args.repeats,
        "batches": len(batches),
        "each_s": {name: [round(value, 4) for value in values] for name, values in times.items()},  # the spread
        **({} if on_cpu else {"interval_ratio": interval_ratios}),
    }
    name = "compare_precision" + {"float32": "", "bfloat16": "_bf16"}[args.dtype]
    name += {"highest": "", "high": "_tf32"}[args.matmul_precision]
    record(name, values, load_before, device=args.device)


if __name__ == "__main__":
    main()
