"""Seconds per prompt for the depth-wise coupling matrix: layerwise's block Jacobians against the authors' method.

Three ways to the Jacobians J^l_{tt} of the last token, each followed by the same mis-coupling matrices
(``depth_coupling``, K = 10, 30, 50, float64 SVDs):

- ``authors``: the authors' method, re-implemented here: one forward pass that keeps the whole graph, then d
  ``torch.autograd.grad`` calls per block (one per output coordinate of the last token, ``retain_graph=True``), each
  giving one row of J;
- ``whole``: layerwise's path before the one-token split (``method="full"``): trace the blocks once, then re-run
  each block on the whole prompt with d vmapped JVPs (math SDPA);
- ``layerwise``: today's default (``method="auto"``): trace once, then each block once on the whole prompt (its
  keys/values kept) and d vmapped VJPs (reverse mode) through the block run on the last token alone
  (``layerwise.features.token_rows``).

Timings: every thread count of ``--threads`` in one run (``torch.set_num_threads``), the methods alternated
(A, B, C, A, B, C, ...), medians. Peak memory: one further run of each method inside the exact allocator tracker
(CPU) or ``max_memory_allocated`` (CUDA), outside the timed runs (the tracker slows every op).

    python benchmarks/coupling.py                                   # GPT-2-small shape, 64 tokens, GPU if any
    python benchmarks/coupling.py --device cpu --layers 4 --dim 256 --heads 4 --threads 1 2   # the issue's shape
"""

import argparse
import statistics
import time

import torch
from _record import load_now, record
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

import layerwise
from layerwise.features.jacobian import diagonal_jacobians, trace_blocks
from layerwise.metrics.functional_dynamics import depth_coupling

hf_logging.set_verbosity_error()
KS = (10, 30, 50)


def build(layers: int, dim: int, heads: int, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "gpt2", n_layer=layers, n_embd=dim, n_head=heads, vocab_size=50257, n_positions=1024, attn_pdrop=0.0
    )
    return AutoModelForCausalLM.from_config(config).to(device).eval()


CHUNK = {"size": None}


def layerwise_jacobians(model: torch.nn.Module, ids: torch.Tensor, method: str = "auto") -> torch.Tensor:
    blocks = model.transformer.h
    trace = trace_blocks(blocks, lambda: model(input_ids=ids, use_cache=False))
    return diagonal_jacobians(blocks, trace, -1, chunk_size=CHUNK["size"], method=method)


def whole_prompt_jacobians(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return layerwise_jacobians(model, ids, method="full")


def authors_jacobians(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """d VJPs per block through the retained graph of one forward pass (the authors' method)."""
    blocks = model.transformer.h
    inputs, outputs = [], []
    handles = [
        block.register_forward_pre_hook(lambda m, a, k: inputs.append(a[0]), with_kwargs=True) for block in blocks
    ]
    handles += [
        block.register_forward_hook(lambda m, a, o: outputs.append(o[0] if isinstance(o, tuple) else o))
        for block in blocks
    ]
    try:
        model(input_ids=ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    dim = inputs[0].shape[-1]
    eye = torch.eye(dim, device=ids.device)
    jacobians = []
    for block_input, block_output in zip(inputs, outputs):
        rows = []
        for i in range(dim):
            (grad,) = torch.autograd.grad(block_output[0, -1, i], block_input, retain_graph=True)
            rows.append(grad[0, -1])
        jacobians.append(torch.stack(rows) - eye)
    return torch.stack(jacobians).detach()


METHODS = {"authors": authors_jacobians, "whole": whole_prompt_jacobians, "layerwise": layerwise_jacobians}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(function, model, ids, device: str) -> tuple[float, float, torch.Tensor]:
    """Seconds for the whole depth-wise matrix and for the Jacobians alone, and the Jacobians."""
    _sync(device)
    start = time.perf_counter()
    jacobians = function(model, ids)
    _sync(device)
    middle = time.perf_counter()
    depth_coupling(jacobians, KS)
    _sync(device)
    return time.perf_counter() - start, middle - start, jacobians


def peak_memory(function, model, ids, device: str) -> int:
    """Peak bytes allocated above the start while the Jacobians and the matrices are computed."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        depth_coupling(function(model, ids), KS)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from _memory import MemoryTracker

    with MemoryTracker() as tracker:
        depth_coupling(function(model, ids), KS)
    return tracker.peak_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads()], help="CPU threads")
    parser.add_argument("--chunk-size", type=int, default=None, help="JVPs at once (default: all d)")
    parser.add_argument("--skip-whole", action="store_true", help="leave out the whole-prompt JVPs")
    parser.add_argument(
        "--record", action="store_true", help="write benchmarks/recorded/coupling[_cuda_<gpu>].json (README's claims)"
    )
    args = parser.parse_args()
    load_before = load_now()
    recorded: dict = {"shape": None, "device": args.device}
    CHUNK["size"] = args.chunk_size
    names = [name for name in METHODS if not (args.skip_whole and name == "whole")]
    print(
        f"layerwise from {layerwise.__file__}; torch {torch.__version__}; device {args.device}"
        + (f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else "")
    )
    model = build(args.layers, args.dim, args.heads, args.device)
    ids = torch.randint(0, 50257, (1, args.tokens), generator=torch.Generator().manual_seed(1)).to(args.device)
    shape = f"{args.layers} x {args.dim}, {args.heads} heads, {args.tokens} tokens, chunk {args.chunk_size or 'all'}"
    torch.set_num_threads(min(args.threads))
    peaks = {name: peak_memory(METHODS[name], model, ids, args.device) for name in names}  # also warms up
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name in names:  # warm-up at this thread count
            timed(METHODS[name], model, ids, args.device)
        times = {name: [] for name in names}
        jacobian_times = {name: [] for name in names}
        results = {}
        for _ in range(args.repeats):
            for name in names:
                seconds, jacobian_seconds, results[name] = timed(METHODS[name], model, ids, args.device)
                times[name].append(seconds)
                jacobian_times[name].append(jacobian_seconds)
        scale = results["authors"].abs().max().item()
        differences = ", ".join(
            f"{name} {(results[name] - results['authors']).abs().max().item():.1e}" for name in names[1:]
        )
        print(f"\n{shape}; {torch.get_num_threads()} thread(s); medians of {args.repeats}")
        print(f"Jacobians max |diff| from the authors': {differences} (max |J| {scale:.2f})")
        print(f"{'method':<12}{'s / prompt':>12}{'speedup':>10}{'Jacobians s':>13}{'speedup':>10}{'peak MiB':>12}")
        base, jacobian_base = statistics.median(times["authors"]), statistics.median(jacobian_times["authors"])
        for name in names:
            median, jacobian_median = statistics.median(times[name]), statistics.median(jacobian_times[name])
            print(
                f"{name:<12}{median:>12.3f}{base / median:>9.1f}x{jacobian_median:>13.3f}"
                f"{jacobian_base / jacobian_median:>9.1f}x{peaks[name] / 2**20:>12.1f}"
            )
        print(f"(each time: {', '.join(f'{name} ' + ' '.join(f'{t:.3f}' for t in times[name]) for name in names)})")
        recorded["shape"] = shape
        for name in names:
            recorded[f"{name}_s_{threads}t"] = round(statistics.median(times[name]), 3)
            recorded[f"{name}_speedup_{threads}t"] = round(base / statistics.median(times[name]), 1)
            recorded[f"{name}_jacobian_speedup_{threads}t"] = round(
                jacobian_base / statistics.median(jacobian_times[name]), 1
            )
    for name in names:
        recorded[f"{name}_peak_mib"] = round(peaks[name] / 2**20, 1)
    if args.record:
        record("coupling", recorded, load_before, device=args.device)


if __name__ == "__main__":
    main()
