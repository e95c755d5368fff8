"""Time and peak memory of the second-moment measures: streamed (layerwise) against the anchors' in-memory code.

Two parts, each case in its own forked process (peak memory = the process's VmHWM above its RSS at the start):

1. ``--part shapes``: every measure at a GPT-2-small / BERT-base shape (12 layers x 768) on 4,096 tokens, layer l
   against the last layer (the 12 pairs a "to the last layer" curve needs), side by side:
   layerwise's ``LayerCKA(debiased=True)`` fed 512 tokens at a time, then ``compute_measures`` per measure, and the
   anchors' formulas (``benchmarks/similarity_anchors.py``: anatome, Morcos et al., netrep, platonic-rep's unbiased
   HSIC, RankMe) on the whole (N, d) float64 matrices, as their users call them. The values are compared too.
2. ``--part tokens``: memory against N = 4k, 16k, 64k tokens at 12 x 96 (a smaller width, stated, so that the
   sweep runs on two CPU cores): the streamed state does not grow; the anchors hold the (N, d) matrices, and the
   debiased CKA's three N x N Grams (64k: 96 GiB) are not attempted past ``--gram-limit`` (reported as needed).
3. ``--part pairs``: the streamed side of part 1 with ``LayerCKA(pairs="all" | "to_last" | "adjacent")``: the
   stacked (L d)^2 moments, or only the (d, d) blocks of L pairs (O(L d^2)); bytes, update time, peak, compute time.

Features are drawn per batch from a seeded generator (correlated layers with decaying spectra), so the streamed
case never holds them all. Run: ``PYTHONPATH=. python benchmarks/similarity_scale.py --part shapes``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import similarity_anchors as anchors  # noqa: E402

from layerwise.metrics import LayerCKA  # noqa: E402
from layerwise.metrics.functional_family import MEASURES, computed_pairs  # noqa: E402

BATCH = 512


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def batches(layers: int, dim: int, tokens: int, seed: int = 0):
    """(L, B, d) float32 batches of a fixed random model, the same for every case."""
    g = torch.Generator().manual_seed(seed)
    mixing = torch.randn(layers, dim, dim, generator=g) / dim**0.5
    spectrum = torch.logspace(0, -2, dim)
    for start in range(0, tokens, BATCH):
        size = min(BATCH, tokens - start)
        base = torch.randn(size, dim, generator=g)
        noise = torch.randn(layers, size, dim, generator=g)
        yield (torch.einsum("bd,lde->lbe", base, mixing) + 0.8 * noise) * spectrum + 1.0


def streamed(layers: int, dim: int, tokens: int, kept: str = "all") -> dict[str, Any]:
    metric = LayerCKA(layers, dim, debiased=True, pairs=kept)
    start = time.perf_counter()
    for batch in batches(layers, dim, tokens):
        metric.update(batch)
    result: dict[str, Any] = {"update_s": time.perf_counter() - start, "values": {}, "seconds": {}}
    result["state_bytes"] = sum(8 * np.prod(shape) for shape in metric._sum_state_shapes.values())
    start = time.perf_counter()
    result["values"]["cka"] = metric.compute()[:, -1].numpy()
    result["seconds"]["cka"] = time.perf_counter() - start
    pairs = computed_pairs(kept, layers) or [(layer, layers - 1) for layer in range(layers)]
    for name in MEASURES:
        start = time.perf_counter()
        value = metric.compute_measures([name], pairs=pairs)[name]
        result["seconds"][name] = time.perf_counter() - start
        result["values"][name] = (value[:, -1] if value.dim() == 2 else value).numpy()
    return result


ANCHOR: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "debiased_cka": anchors.platonic_unbiased_cka,
    "cca": anchors.anatome_mean_cca,
    "svcca": anchors.anatome_svcca,
    "pwcca": anchors.morcos_pwcca,
    "procrustes": lambda x, y: float(np.sqrt(2 * anchors.anatome_procrustes(x, y))),
    "shape": lambda x, y: anchors.netrep_angular(x, y, 0.5),
}
ANCHOR_NAMES = {
    "debiased_cka": "platonic-rep unbiased_cka (N x N Grams)",
    "cca": "anatome cca (svd)",
    "svcca": "anatome svcca_distance",
    "pwcca": "Morcos et al. pwcca.py",
    "procrustes": "anatome orthogonal_procrustes_distance",
    "shape": "netrep LinearMetric(0.5, angular)",
    "effective_rank": "RankMe (SVD of the (N, d) matrix)",
}


def in_memory(layers: int, dim: int, tokens: int, gram_limit: float) -> dict[str, Any]:
    start = time.perf_counter()
    h = torch.cat(list(batches(layers, dim, tokens)), dim=1).double().numpy()
    result: dict[str, Any] = {"load_s": time.perf_counter() - start, "values": {}, "seconds": {}}
    for name in MEASURES:
        if name == "debiased_cka" and 3 * 8 * tokens**2 > gram_limit:
            result["values"][name] = None
            result["seconds"][name] = f"needs {3 * 8 * tokens**2 / 2**30:.0f} GiB of Grams"
            continue
        start = time.perf_counter()
        if name == "effective_rank":
            values = [anchors.rankme(x, eps=0.0) for x in h]
        else:
            values = [ANCHOR[name](x, h[-1]) if layer < layers - 1 else np.nan for layer, x in enumerate(h)]
        result["seconds"][name] = time.perf_counter() - start
        result["values"][name] = np.array(values)
    return result


def _child(function: Callable[..., dict[str, Any]], args: tuple, queue: Any) -> None:
    torch.set_num_threads(1)
    base = _status("VmRSS")
    result = function(*args)
    result["peak_bytes"] = _status("VmHWM") - base
    queue.put(result)


def measured(function: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    context = mp.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=_child, args=(function, args, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def shapes(layers: int, dim: int, tokens: int, gram_limit: float) -> None:
    ours, theirs = measured(streamed, layers, dim, tokens), measured(in_memory, layers, dim, tokens, gram_limit)
    print(
        f"{layers} x {dim}, {tokens} tokens, pairs (l, L): streamed update {ours['update_s']:.1f} s, "
        f"peak {ours['peak_bytes'] / 2**20:.0f} MiB; in memory: features {theirs['load_s']:.1f} s, "
        f"peak {theirs['peak_bytes'] / 2**20:.0f} MiB"
    )
    print("| measure | layerwise compute (s) | anchor | anchor (s) | max abs difference |")
    print("|---|---|---|---|---|")
    for name in MEASURES:
        mine, other = ours["values"][name], theirs["values"][name]
        if other is None or name == "svcca":
            difference = "— (different rule)" if other is not None else "—"
        else:
            finite = np.isfinite(other) & np.isfinite(mine)
            finite[-1] = finite[-1] and name == "effective_rank"  # the pair (L, L): exact here by design
            difference = f"{np.abs(mine - other)[finite].max():.1e}"
        seconds = theirs["seconds"][name]
        seconds = f"{seconds:.1f}" if isinstance(seconds, float) else seconds
        print(f"| {name} | {ours['seconds'][name]:.1f} | {ANCHOR_NAMES[name]} | {seconds} | {difference} |")


def tokens_sweep(layers: int, dim: int, sizes: list[int], gram_limit: float) -> None:
    print("| tokens | streamed peak (MiB) | streamed update (s) | in-memory peak (MiB) | debiased CKA in memory |")
    print("|---|---|---|---|---|")
    for tokens in sizes:
        ours = measured(streamed, layers, dim, tokens)
        theirs = measured(in_memory, layers, dim, tokens, gram_limit)
        seconds = theirs["seconds"]["debiased_cka"]
        gram = f"{seconds:.1f} s" if isinstance(seconds, float) else seconds
        print(
            f"| {tokens} | {ours['peak_bytes'] / 2**20:.0f} | {ours['update_s']:.1f} | "
            f"{theirs['peak_bytes'] / 2**20:.0f} | {gram} |"
        )


def pairs_part(layers: int, dim: int, tokens: int) -> None:
    """The streamed measures with ``LayerCKA(pairs=...)``: every pair's stacked moments, or the blocks of L pairs."""
    print("| pairs | state (MiB) | streamed update (s) | peak (MiB) | CKA + every measure at the L pairs (s) |")
    print("|---|---|---|---|---|")
    for kept in ("all", "to_last", "adjacent"):
        ours = measured(streamed, layers, dim, tokens, kept)
        print(
            f"| {kept} | {ours['state_bytes'] / 2**20:.0f} | {ours['update_s']:.1f} | "
            f"{ours['peak_bytes'] / 2**20:.0f} | {sum(ours['seconds'].values()):.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("shapes", "tokens", "pairs"), default="shapes")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dim", type=int, default=None, help="768 for shapes, 96 for tokens")
    parser.add_argument("--tokens", type=int, nargs="+", default=None, help="4096 for shapes; 4096 16384 65536")
    parser.add_argument("--gram-limit", type=float, default=4 * 2**30, help="bytes of N x N Grams to attempt")
    args = parser.parse_args()
    if args.part == "shapes":
        shapes(args.layers, args.dim or 768, (args.tokens or [4096])[0], args.gram_limit)
    elif args.part == "pairs":
        pairs_part(args.layers, args.dim or 768, (args.tokens or [4096])[0])
    else:
        tokens_sweep(args.layers, args.dim or 96, args.tokens or [4096, 16384, 65536], args.gram_limit)


if __name__ == "__main__":
    main()
