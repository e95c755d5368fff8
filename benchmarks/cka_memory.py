"""Peak memory of ``LayerCKA`` over one epoch (construct, update, compute, reset), at the shapes users run.

Measured with ``benchmarks/_memory.py``'s exact allocator tracker (CPU) around the whole epoch; the features are
made before entry and not counted. Run it on two checkouts to compare versions side by side, e.g.

    .venv/bin/python benchmarks/cka_memory.py                       # this checkout
    git worktree add /tmp/old <commit> && PYTHONPATH=/tmp/old .venv/bin/python benchmarks/cka_memory.py

``state MiB`` is one (L*d)^2 float64 state; the peak also holds ``compute``'s temporaries (one d x L*d block row).
"""

import argparse

import torch
from _memory import MemoryTracker

import layerwise
from layerwise.metrics import LayerCKA


def epoch_peak(layers: int, dim: int, batches: int, batch_size: int) -> int:
    features = [torch.randn(layers, batch_size, dim) for _ in range(batches)]
    with MemoryTracker() as tracker:
        metric = LayerCKA(layers, dim)
        for batch in features:
            metric.update(batch)
        metric.compute()
        metric.reset()
        del metric
    return tracker.peak_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["6x64", "12x384", "12x768"], help="LxD shapes")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    print(f"layerwise from {layerwise.__file__}")
    print(f"{'L x d':<10}{'state MiB':>11}{'epoch peak MiB':>16}{'peak / state':>14}")
    for shape in args.shapes:
        layers, dim = (int(part) for part in shape.split("x"))
        state = (layers * dim) ** 2 * 8
        peak = epoch_peak(layers, dim, args.batches, args.batch_size)
        print(f"{shape:<10}{state / 2**20:>11.1f}{peak / 2**20:>16.1f}{peak / state:>14.2f}")


if __name__ == "__main__":
    main()
