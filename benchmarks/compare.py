"""Cross-model CKA throughput against the two forward passes alone, its memory against the number of tokens, and
the stitching step time against a plain frozen forward.

Two random GPT-2-small-shaped models (12 x 768) read the same batches of random token ids:

- ``plain``: A's and B's base models (no LM head, as ``layerwise compare`` loads them) alone, no hooks, per batch;
- ``compare``: ``engines.compare.compare_models`` over 2 and over 8 batches: both forwards with hooks on every
  block, the real tokens gathered, ``CrossModelCKA`` updated (float64 sums, 793 MiB of state for two 12 x 768
  models); the difference / 6 is the cost of each further batch (the throughput), the rest the once-per-comparison
  cost (allocating the states, ``compute``); with every layer pair (``pairs="all"``) and with the pairs (i, i) only
  (``pairs="diagonal"``, all the arccos distance needs);
- memory: the peak after 2 and after 8 batches (flat in the number of tokens: the state does not grow);
- stitching: one training step of ``Stitched`` (A up to block 6, phi, B from block 7; backward through phi only)
  against one frozen forward of A and B.

Variants alternate in one process (medians). Peak memory: CUDA's ``max_memory_allocated``, on the CPU the exact
allocator tracker of ``benchmarks/_memory.py``.

    python benchmarks/compare.py                 # GPU if any; GPT-2-small shape, batch 8 x 256 tokens
    python benchmarks/compare.py --device cpu --layers 4 --dim 256 --heads 4 --tokens 128
"""

import argparse
import functools
import statistics
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

import layerwise
from layerwise.engines.compare import compare_models
from layerwise.lightning_modules.stitched import Stitched

hf_logging.set_verbosity_error()


def build(args: argparse.Namespace, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = AutoConfig.for_model("gpt2", n_layer=args.layers, n_embd=args.dim, n_head=args.heads, vocab_size=50257)
    return AutoModelForCausalLM.from_config(config).to(args.device).eval()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(function, device: str) -> float:
    sync(device)
    start = time.perf_counter()
    function()
    sync(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"layerwise from {layerwise.__file__}; torch {torch.__version__}; device {args.device}")
    a, b = build(args, 0), build(args, 1)
    generator = torch.Generator().manual_seed(2)
    batches = [
        {"input_ids": torch.randint(0, 50257, (args.batch, args.tokens), generator=generator).to(args.device)}
        for _ in range(8)
    ]

    base_a, base_b = a.base_model, b.base_model  # `layerwise compare` loads base models: no LM head

    def plain() -> None:
        with torch.no_grad():
            for batch in batches:
                base_a(**batch)
                base_b(**batch)

    plain(), compare_models(base_a, base_b, batches[:2])  # warm-up
    times: dict[str, list[float]] = {"plain": []}
    for _ in range(args.repeats):
        times["plain"].append(timed(plain, args.device) / len(batches))
        for pairs in ("all", "diagonal"):
            for count in (2, 8):
                run = functools.partial(compare_models, base_a, base_b, batches[:count], pairs=pairs)
                times.setdefault(f"{pairs}_{count}", []).append(timed(run, args.device))
    base = statistics.median(times["plain"])
    print(f"\n{args.layers} x {args.dim} models, batch {args.batch} x {args.tokens} tokens, medians of {args.repeats}")
    print(f"{'per batch':<52}{'s':>9}{'ratio':>9}")
    print(f"{'A and B forward, no hooks':<52}{base:>9.4f}{1.0:>8.2f}x")
    for pairs in ("all", "diagonal"):
        two, eight = statistics.median(times[f"{pairs}_2"]), statistics.median(times[f"{pairs}_8"])
        per_batch = (eight - two) / 6  # the streaming cost of one more batch: hooked forwards + float64 update
        fixed = two - 2 * per_batch  # once per comparison: the states' allocation, compute, the arccos distance
        print(f"{f'compare_models pairs={pairs}, each further batch':<52}{per_batch:>9.4f}{per_batch / base:>8.2f}x")
        print(f"{f'compare_models pairs={pairs}, once per comparison':<52}{fixed:>9.4f}{fixed / base:>8.2f}x")

    for count in (2, 8):
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            compare_models(base_a, base_b, batches[:count])
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - before
        else:
            from _memory import MemoryTracker

            with MemoryTracker() as tracker:
                compare_models(base_a, base_b, batches[:count])
            peak = tracker.peak_bytes
        print(f"peak over {count} batches ({count * args.batch * args.tokens} tokens): {peak / 2**20:,.1f} MiB")

    stitched = Stitched(a, b, args.layers // 2, args.layers // 2, lr=0.1, warmup_steps=1, max_steps=100).to(args.device)
    optimizer = torch.optim.SGD(stitched.phi.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    batch = {**batches[0], "attention_mask": torch.ones_like(batches[0]["input_ids"])}

    def step() -> None:
        loss = stitched.loss(stitched(batch), batch)[0]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    def frozen() -> None:
        with torch.no_grad():
            a(**batch)
            b(**batch)

    step(), frozen()
    steps = {"frozen": [], "step": []}
    for _ in range(args.repeats):
        steps["frozen"].append(timed(frozen, args.device))
        steps["step"].append(timed(step, args.device))
    base = statistics.median(steps["frozen"])
    print(f"\nstitching (A up to block {args.layers // 2}, B from block {args.layers // 2 + 1}), one batch:")
    print(f"{'frozen forward of A and B':<34}{base:>9.4f}{1.0:>8.2f}x")
    print(
        f"{'Stitched training step':<34}{statistics.median(steps['step']):>9.4f}"
        f"{statistics.median(steps['step']) / base:>8.2f}x"
    )


if __name__ == "__main__":
    main()
