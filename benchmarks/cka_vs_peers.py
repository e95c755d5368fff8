"""Exact all-pairs linear CKA: layerwise against the CKA packages a user would otherwise install from PyPI.

Same features for everyone: a random residual stream of L = 12 layers, N samples, width d = 384, float32, in memory
(h_1 = mu + z_1, h_(l+1) = h_l + 0.5 z_(l+1), z Gaussian, mu a fixed per-feature mean of scale 1, so centring
matters). For every N it measures, side by side in one run:

- ``LayerCKA`` (exact, streamed): ``update`` on batches of 1,024 rows, then ``compute``; and ``MinibatchCKA``
  (unbiased HSIC summed over the same batches);
- ``ckatorch`` ``cka_base(x, y)`` (kernel="linear", biased, the default): exact CKA from the centred N x N float64
  Gram matrices, called once per pair of layers (66 pairs and 12 diagonals, as a loop over its public function does):
  the same quantity as ``LayerCKA``;
- ``torch-cka`` ``CKA.compare``: its only estimator, the unbiased HSIC of Nguyen et al. (2021) averaged over the
  minibatches of a DataLoader, in float32. It is driven through its own ``compare`` by a stand-in model whose 12
  hooked ``nn.Identity`` layers replay the features of each batch (batches of 1,024 in order): the same quantity as
  ``MinibatchCKA``, not as exact CKA.

Peers are not dependencies of layerwise. Install them outside the project's environment, e.g.

    .venv/bin/pip install --target /tmp/peerpkgs --no-deps ckatorch==1.0.3 torch-cka==0.21 seaborn

(ckatorch's ``__init__`` imports seaborn; its other needs, and torch-cka's, are already in the venv). The script appends
``--peer-path`` (default /tmp/peerpkgs) to ``sys.path`` only if the directory exists, and skips a peer that does not
import, printing why and how to install it.

Time: wall seconds of the whole computation (metric construction, all updates and compute; all peer calls); the
layerwise rows are medians over ``--repeats`` runs. A peer runs at most ``--budget`` seconds per N: its work comes
in identical units (ckatorch: one pair call, all of the same shapes; torch-cka: one batch), so when all units would
not fit, the first k units (pairs in a fixed shuffled order, batches in order; k from the time of the memory-tracked
unit) are timed and the time is scaled by units/k (printed as "k/units"). A peer whose peak
memory, predicted from a smaller N, would not fit in the free memory is not run: its time and memory are
extrapolated from the largest N at which it ran, by N^2 for ckatorch (an N x N Gram per call), and printed as such,
together with the exponent measured between two smaller N.

Memory: ``benchmarks/_memory.py``'s ``MemoryTracker``, the exact peak of bytes allocated by torch above the level on
entry (CPU: the profiler's allocator events, temporaries inside kernels included; CUDA: the allocator's statistics),
in a separate run from the timed ones. The features exist before entry and are not counted. For the peers, one unit
(one pair call, one batch) is tracked: units run one after another and keep nothing but a few scalars.

Exit status 1 when a target is missed (at the largest N: layerwise >= 20x faster than the fastest peer computing
exact CKA; peak memory of ``LayerCKA`` not growing with N; values within 1e-6 of every peer computing the same
quantity in float64), else 0.

    .venv/bin/python benchmarks/cka_vs_peers.py                    # N = 10,000 and 50,000 (~25 min on 2 CPU cores)
    .venv/bin/python benchmarks/cka_vs_peers.py --quick            # N = 2,000, every pair of every peer
    .venv/bin/python benchmarks/cka_vs_peers.py --n 20000 --budget 600 --peers ckatorch
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.metadata
import io
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _memory import MemoryTracker  # noqa: E402

from layerwise.metrics import LayerCKA, MinibatchCKA  # noqa: E402

SPEEDUP_TARGET = 20.0
VALUE_TARGET = 1e-6
MEMORY_GROWTH_TOLERANCE = 0.01  # relative growth of LayerCKA's peak from the smallest to the largest N
PROBE_N = 2000  # a size at which every peer fits, to predict the memory of larger N
INSTALL = ".venv/bin/pip install --target {path} --no-deps {spec}"
MIB = 2**20


# ------------------------------------------------------------------------------------------------------- features
def residual_stream(layers: int, rows: int, dim: int, seed: int) -> Tensor:
    """Features (L, N, d) float32 of a random residual stream: correlated across layers, with a non-zero mean."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.empty(layers, rows, dim)
    features[0] = torch.randn(dim, generator=generator) + torch.randn(rows, dim, generator=generator)
    for layer in range(1, layers):
        features[layer] = features[layer - 1] + 0.5 * torch.randn(rows, dim, generator=generator)
    return features


def batches(rows: int, batch_size: int) -> list[slice]:
    """Consecutive row slices of at most ``batch_size`` rows."""
    return [slice(start, min(start + batch_size, rows)) for start in range(0, rows, batch_size)]


# ------------------------------------------------------------------------------------------------------ layerwise
def layerwise_exact(features: Tensor, batch_size: int) -> Tensor:
    """All-pairs exact CKA (L, L) with ``LayerCKA`` streamed over batches."""
    layers, rows, dim = features.shape
    metric = LayerCKA(layers, dim).to(features.device)
    for rows_of_batch in batches(rows, batch_size):
        metric.update(features[:, rows_of_batch])
    return metric.compute()


def layerwise_minibatch(features: Tensor, batch_size: int) -> Tensor:
    """All-pairs minibatch CKA (L, L) with ``MinibatchCKA`` over the same batches."""
    layers, rows, _ = features.shape
    metric = MinibatchCKA(layers).to(features.device)
    for rows_of_batch in batches(rows, batch_size):
        metric.update(features[:, rows_of_batch])
    return metric.compute()


# ---------------------------------------------------------------------------------------------------------- peers
@dataclass
class Peer:
    """A peer package, driven through its own code on the given features, in ``units`` of identical work.

    ``run(features, k)`` computes the first k units and returns an (L, L) float64 matrix, NaN where not computed.
    ``same_as`` names the layerwise computation of the same quantity ("exact" or "minibatch");
    ``memory_exponent``/``time_exponent``: how one unit's peak memory and time grow with N (from the peer's source).
    """

    key: str
    label: str
    quantity: str
    same_as: str
    float64: bool
    units: Callable[[int], int]
    unit_name: str
    run: Callable[[Tensor, int], Tensor]
    memory_exponent: int
    time_exponent: int
    version: str = ""


def pair_order(layers: int, seed: int = 0) -> list[tuple[int, int]]:
    """The L(L+1)/2 pairs a <= b in a fixed shuffled order, so that the first k of them spread over the matrix."""
    pairs = [(a, b) for a in range(layers) for b in range(a, layers)]
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed)).tolist()
    return [pairs[i] for i in order]


def make_ckatorch(module: Any, batch_size: int) -> Peer:
    """ckatorch's exact CKA, ``cka_base(x, y)`` with its defaults (linear kernel, biased, Frobenius form)."""
    del batch_size

    def run(features: Tensor, count: int) -> Tensor:
        layers = features.shape[0]
        out = torch.full((layers, layers), float("nan"), dtype=torch.float64)
        for a, b in pair_order(layers)[:count]:
            out[a, b] = out[b, a] = module.cka_base(features[a], features[b]).item()
        return out

    return Peer(
        key="ckatorch",
        label="ckatorch cka_base",
        quantity="exact, biased HSIC, N x N float64 Grams",
        same_as="exact",
        float64=True,
        units=lambda rows: 0,  # set in main: L(L+1)/2 pairs whatever N
        unit_name="pairs",
        run=run,
        memory_exponent=2,
        time_exponent=2,
    )


class _Replay(nn.Module):
    """A stand-in model for torch-cka: given the row indices of a batch, its L hooked layers output those features."""

    def __init__(self, features: Tensor) -> None:
        super().__init__()
        self.features = features
        self.layers = nn.ModuleList(nn.Identity() for _ in range(features.shape[0]))

    def forward(self, index: Tensor) -> None:
        rows = slice(int(index[0]), int(index[-1]) + 1)  # batches are consecutive rows (no shuffling)
        for layer, features in zip(self.layers, self.features):
            layer(features[rows])


def make_torch_cka(module: Any, batch_size: int) -> Peer:
    """torch-cka's ``CKA.compare``: unbiased HSIC averaged over the batches of a DataLoader, float32."""
    from torch.utils.data import DataLoader, TensorDataset

    def run(features: Tensor, count: int) -> Tensor:
        layers, rows, _ = features.shape
        used = min(rows, count * batch_size)
        loader = DataLoader(TensorDataset(torch.arange(used)), batch_size=batch_size)
        names = [f"layers.{layer}" for layer in range(layers)]
        device = str(features.device)
        peer = module.CKA(_Replay(features), _Replay(features), "features_a", "features_b", names, names, device)
        with contextlib.redirect_stderr(io.StringIO()):  # its tqdm progress bar
            peer.compare(loader, loader)
        return peer.hsic_matrix.to(torch.float64)

    return Peer(
        key="torch-cka",
        label="torch-cka CKA.compare",
        quantity=f"minibatch, unbiased HSIC, batches of {batch_size}, float32",
        same_as="minibatch",
        float64=False,
        units=lambda rows: math.ceil(rows / batch_size),
        unit_name="batches",
        run=run,
        memory_exponent=0,
        time_exponent=0,
    )


PEERS: dict[str, tuple[str, str, str, Callable[[Any, int], Peer]]] = {
    # key: (import name, distribution, install spec, factory)
    "ckatorch": ("ckatorch", "ckatorch", "ckatorch==1.0.3 seaborn", make_ckatorch),
    "torch-cka": ("torch_cka", "torch-cka", "torch-cka==0.21", make_torch_cka),
}


def load_peers(keys: list[str], peer_path: str, batch_size: int, layers: int) -> list[Peer]:
    """Import the requested peers; print why a peer is skipped and how to install it."""
    if os.path.isdir(peer_path) and peer_path not in sys.path:
        sys.path.append(peer_path)  # appended: the project's own packages keep precedence
    peers = []
    for key in keys:
        module_name, distribution, spec, factory = PEERS[key]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(module_name)
        except Exception as error:  # any import failure means the peer cannot be measured here
            print(f"skipping {key}: import {module_name} failed ({type(error).__name__}: {error})")
            print(f"  install it with: {INSTALL.format(path=peer_path, spec=spec)}")
            continue
        peer = factory(module, batch_size)
        peer.version = importlib.metadata.version(distribution)
        if key == "ckatorch":
            pairs = layers * (layers + 1) // 2
            peer.units = lambda rows, pairs=pairs: pairs
        peers.append(peer)
        print(f"{key} {peer.version} from {Path(module.__file__).parent}")
    return peers


# -------------------------------------------------------------------------------------------------- measurement
def synchronize(device: torch.device) -> None:
    """Wait for the device."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(action: Callable[[], Tensor], device: torch.device) -> tuple[Tensor, float]:
    """Result and wall seconds of one call (after a garbage collection, so that none falls inside)."""
    gc.collect()
    synchronize(device)
    start = time.perf_counter()
    result = action()
    synchronize(device)
    return result, time.perf_counter() - start


def peak_bytes(action: Callable[[], Any], device: torch.device) -> tuple[int, float]:
    """Peak bytes allocated above the entry level while ``action`` runs (MemoryTracker), and its seconds.

    The garbage collector is run before and paused inside: a cycle from an earlier run (a metric holding its
    state) freed inside the block would lower the running sum of the allocator events and hide the peak.
    """
    gc.collect()
    gc.disable()
    try:
        with MemoryTracker(device=device.type) as tracker:
            _, seconds = timed(action, device)
    finally:
        gc.enable()
    return tracker.peak_bytes, seconds


def free_bytes(device: torch.device) -> int:
    """Memory available for a new allocation: MemAvailable on CPU, free device memory on CUDA."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info()[0]
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def gib(size: float) -> str:
    """Bytes as GiB (MiB below 1 GiB)."""
    return f"{size / 2**30:,.1f} GiB" if size >= 2**30 else f"{size / MIB:,.1f} MiB"


def max_abs_diff(a: Tensor, b: Tensor) -> float:
    """Largest |a - b| over the entries where both are finite (a peer may have computed only some pairs)."""
    a, b = a.double().cpu(), b.double().cpu()
    mask = torch.isfinite(a) & torch.isfinite(b)
    return (a[mask] - b[mask]).abs().max().item()


@dataclass
class Row:
    """One line of the table."""

    name: str
    quantity: str
    seconds: float
    timing: str
    peak: float
    memory: str
    ratio_exact: Optional[float] = None
    ratio_same: Optional[float] = None
    peer: Optional[Peer] = None
    diff_same: Optional[float] = None  # max |difference| from the layerwise metric of the same quantity
    diffs: list[str] = field(default_factory=list)  # the differences as printed


@dataclass
class PeerHistory:
    """What was measured for a peer at earlier N, for predictions and extrapolation."""

    unit_seconds: dict[int, float] = field(default_factory=dict)  # N -> seconds per unit
    peak: dict[int, int] = field(default_factory=dict)  # N -> peak bytes of one unit


def fitted_exponent(values: dict[int, float]) -> Optional[float]:
    """Exponent p of value ~ N^p between the smallest and the largest N measured."""
    if len(values) < 2:
        return None
    small, large = min(values), max(values)
    return math.log(values[large] / values[small]) / math.log(large / small)


def measure_peer(
    peer: Peer, features: Tensor, history: PeerHistory, budget: float, exact: Tensor, minibatch: Callable[[int], Tensor]
) -> tuple[Row, list[str]]:
    """Run (or extrapolate) one peer at the size of ``features``; return its row and notes."""
    layers, rows, _ = features.shape
    device = features.device
    units = peer.units(rows)
    notes = []
    if history.peak:
        known = max(history.peak)
        predicted = history.peak[known] * (rows / known) ** peer.memory_exponent
    else:
        predicted = 0.0
    available = free_bytes(device)
    if predicted > 0.7 * available:
        known = max(history.unit_seconds)
        seconds = units * history.unit_seconds[known] * (rows / known) ** peer.time_exponent
        peak = history.peak[known] * (rows / known) ** peer.memory_exponent
        time_fit, memory_fit = fitted_exponent(history.unit_seconds), fitted_exponent(history.peak)
        notes.append(
            f"{peer.key} at N={rows:,} not run: one {peer.unit_name[:-1]} would need ~{gib(predicted)} (predicted by "
            f"N^{peer.memory_exponent} from N={known:,}), {gib(available)} are free. Its time and memory are "
            f"extrapolated from N={known:,} by N^{peer.time_exponent} and N^{peer.memory_exponent}"
            + (
                f" (exponents measured between N={min(history.peak):,} and N={known:,}: time {time_fit:.2f}, "
                f"memory {memory_fit:.2f})."
                if time_fit is not None and memory_fit is not None
                else "."
            )
        )
        timing = f"extrapolated N^{peer.time_exponent}"
        return Row(peer.label, peer.quantity, seconds, timing, peak, "extrapolated", peer=peer), notes
    with torch.inference_mode():
        peak, probe_seconds = peak_bytes(lambda: peer.run(features, 1), device)
        count = units if budget >= units * probe_seconds else max(1, int(budget // probe_seconds))
        values, seconds = timed(lambda: peer.run(features, count), device)
    history.peak[rows] = peak
    history.unit_seconds[rows] = seconds / count
    timing = "all" if count == units else f"{count}/{units} {peer.unit_name}, scaled"
    if count < units:
        seconds *= units / count
    row = Row(peer.label, peer.quantity, seconds, timing, peak, "1 unit tracked", peer=peer)
    reference = exact if peer.same_as == "exact" else minibatch(count)
    row.diff_same = max_abs_diff(values, reference)
    same_name = "LayerCKA" if peer.same_as == "exact" else "MinibatchCKA"
    scope = f"all {units} {peer.unit_name}" if count == units else f"first {count}/{units} {peer.unit_name}"
    row.diffs.append(f"{row.diff_same:.1e} vs {same_name} ({scope})")
    if peer.same_as != "exact":
        row.diffs.append(f"{max_abs_diff(values, exact):.1e} vs LayerCKA (other quantity)")
    return row, notes


# --------------------------------------------------------------------------------------------------------- report
def measure_layerwise(features: Tensor, batch_size: int, repeats: int) -> tuple[list[Row], Tensor, int]:
    """Rows of LayerCKA and MinibatchCKA at the size of ``features``, the exact CKA and LayerCKA's peak bytes."""
    device = features.device
    exact_fn = lambda: layerwise_exact(features, batch_size)  # noqa: E731
    minibatch_fn = lambda: layerwise_minibatch(features, batch_size)  # noqa: E731
    with torch.inference_mode():
        exact_peak, _ = peak_bytes(exact_fn, device)
        minibatch_peak, _ = peak_bytes(minibatch_fn, device)
        exact_runs = [timed(exact_fn, device) for _ in range(repeats)]
        minibatch_runs = [timed(minibatch_fn, device) for _ in range(repeats)]
    exact, exact_seconds = exact_runs[0][0], statistics.median(seconds for _, seconds in exact_runs)
    minibatch, minibatch_seconds = minibatch_runs[0][0], statistics.median(seconds for _, seconds in minibatch_runs)
    timing = "all" if repeats == 1 else f"median of {repeats}"
    quantity = f"minibatch, unbiased HSIC, batches of {batch_size}"
    rows = [
        Row("layerwise LayerCKA", "exact, streamed", exact_seconds, timing, exact_peak, "tracked", 1.0, 1.0),
        Row("layerwise MinibatchCKA", quantity, minibatch_seconds, timing, minibatch_peak, "tracked", 1.0, 1.0),
    ]
    rows[1].ratio_exact = minibatch_seconds / exact_seconds
    rows[1].diffs.append(f"{max_abs_diff(minibatch, exact):.1e} vs LayerCKA (other quantity)")
    return rows, exact, exact_peak


def print_table(rows_by_n: dict[int, list[Row]]) -> None:
    """Markdown table of every N."""
    columns = ["N", "implementation", "quantity", "time s", "timed", "vs LayerCKA", "vs same quantity", "peak MiB"]
    print("| " + " | ".join(columns + ["max abs diff"]) + " |")
    print("| --- " * (len(columns) + 1) + "|")
    for rows, table in rows_by_n.items():
        for row in table:
            exact = "" if row.ratio_exact is None else f"{row.ratio_exact:,.1f}x"
            same = "" if row.ratio_same is None else f"{row.ratio_same:,.1f}x"
            memory = f"{row.peak / MIB:,.1f}" + (" (extrapolated)" if row.memory == "extrapolated" else "")
            cells = [f"{rows:,}", row.name, row.quantity, f"{row.seconds:,.1f}", row.timing, exact, same, memory]
            print("| " + " | ".join(cells + ["; ".join(row.diffs)]) + " |")


def report_targets(rows_by_n: dict[int, list[Row]], layerwise_peaks: dict[int, int]) -> bool:
    """Print PASS/FAIL for every target that can be evaluated; False when one fails."""
    largest = max(rows_by_n)
    ok = True
    print(f"\nTargets at N={largest:,}:")
    exact_peers = [row for row in rows_by_n[largest] if row.peer is not None and row.peer.same_as == "exact"]
    if exact_peers:
        fastest = min(exact_peers, key=lambda row: row.seconds)
        passed = fastest.ratio_same >= SPEEDUP_TARGET
        ok &= passed
        print(
            f"  {'PASS' if passed else 'FAIL'} speed: LayerCKA {fastest.ratio_same:,.1f}x faster than the fastest exact"
            f" peer ({fastest.name}, {fastest.timing}) (target >= {SPEEDUP_TARGET:g}x)"
        )
    else:
        print("  n/a  speed: no peer computing exact CKA was importable")
    if len(layerwise_peaks) > 1:
        small, large = min(layerwise_peaks), max(layerwise_peaks)
        growth = layerwise_peaks[large] / layerwise_peaks[small] - 1
        passed = growth <= MEMORY_GROWTH_TOLERANCE
        ok &= passed
        print(
            f"  {'PASS' if passed else 'FAIL'} memory: LayerCKA peak {layerwise_peaks[small] / MIB:,.1f} MiB at "
            f"N={small:,}, {layerwise_peaks[large] / MIB:,.1f} MiB at N={large:,} ({100 * growth:+.2f}%)"
        )
    else:
        print("  n/a  memory: give two or more --n to see whether LayerCKA's peak grows with N")
    diffs = [
        row.diff_same
        for table in rows_by_n.values()
        for row in table
        if row.peer is not None and row.peer.float64 and row.diff_same is not None
    ]
    if diffs:
        passed = max(diffs) <= VALUE_TARGET
        ok &= passed
        print(
            f"  {'PASS' if passed else 'FAIL'} values: largest |difference| from a float64 peer computing the same "
            f"quantity {max(diffs):.1e} (target <= {VALUE_TARGET:g}), over every N where one ran"
        )
    else:
        print("  n/a  values: no float64 peer computing the same quantity ran")
    return ok


def probe_peers(peers: list[Peer], features: Tensor, histories: dict[str, PeerHistory]) -> None:
    """Run one unit of every peer whose memory grows with N at ``PROBE_N`` rows, to predict whether larger N fit."""
    for peer in peers:
        if peer.memory_exponent == 0:
            continue
        unit = lambda p=peer: p.run(features[:, :PROBE_N], 1)  # noqa: E731
        with torch.inference_mode():
            peak, _ = peak_bytes(unit, features.device)
            _, seconds = timed(unit, features.device)
        histories[peer.key].peak[PROBE_N] = peak
        histories[peer.key].unit_seconds[PROBE_N] = seconds
        print(f"probe {peer.key} at N={PROBE_N:,}: one {peer.unit_name[:-1]}, {seconds:.2f} s, {peak / MIB:,.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10_000, 50_000], help="numbers of samples N")
    parser.add_argument("--layers", type=int, default=12, help="L")
    parser.add_argument("--dim", type=int, default=384, help="d")
    parser.add_argument("--batch-size", type=int, default=1024, help="rows per streamed batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of the layerwise rows (median)")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds a peer may run per N (then: scaled)")
    parser.add_argument("--peers", nargs="+", choices=list(PEERS), default=list(PEERS), help="peers to compare")
    parser.add_argument("--peer-path", default="/tmp/peerpkgs", help="directory the peers were pip-installed into")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu", help="auto: cuda if available")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help=f"N = {PROBE_N:,} and every unit of every peer")
    args = parser.parse_args()
    if args.quick:
        args.n, args.budget = [PROBE_N], float("inf")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    sizes = sorted(set(args.n))
    gpu = f" ({torch.cuda.get_device_name()})" if device.type == "cuda" else ""
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"{torch.get_num_threads()} torch threads, device {device}{gpu}, load average {os.getloadavg()[0]:.1f}"
    )
    tracker = "the profiler's allocator events" if device.type == "cpu" else "the CUDA allocator"
    print(
        f"features: L={args.layers}, d={args.dim}, N in {sizes}, float32 residual stream; batches of {args.batch_size};"
        f" peer budget {args.budget:g} s per N; memory: MemoryTracker ({tracker}), peak above entry"
    )
    peers = load_peers(args.peers, args.peer_path, args.batch_size, args.layers)
    features_all = residual_stream(args.layers, max(sizes), args.dim, args.seed).to(device)
    histories = {peer.key: PeerHistory() for peer in peers}
    if PROBE_N < sizes[0]:
        probe_peers(peers, features_all, histories)

    rows_by_n: dict[int, list[Row]] = {}
    notes: list[str] = []
    layerwise_peaks: dict[int, int] = {}
    for rows in sizes:
        features = features_all[:, :rows]
        print(f"\nN={rows:,}: layerwise ...", flush=True)
        table, exact, layerwise_peaks[rows] = measure_layerwise(features, args.batch_size, args.repeats)

        def minibatch_of(count: int, features: Tensor = features) -> Tensor:
            """MinibatchCKA over the first ``count`` batches (what a budget-limited torch-cka run saw)."""
            with torch.inference_mode():
                return layerwise_minibatch(features[:, : count * args.batch_size], args.batch_size)

        for peer in peers:
            print(f"N={rows:,}: {peer.key} ...", flush=True)
            row, peer_notes = measure_peer(peer, features, histories[peer.key], args.budget, exact, minibatch_of)
            row.ratio_exact = row.seconds / table[0].seconds
            row.ratio_same = row.seconds / table[0 if peer.same_as == "exact" else 1].seconds
            table.append(row)
            notes += peer_notes
        rows_by_n[rows] = table
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}\n")
    print("'vs LayerCKA': time / LayerCKA's time; 'vs same quantity': time / the time of the layerwise metric that")
    print("computes the same quantity (LayerCKA or MinibatchCKA), i.e. how many times faster layerwise is.\n")
    print_table(rows_by_n)
    for note in notes:
        print(f"\n- {note}")
    if not report_targets(rows_by_n, layerwise_peaks):
        sys.exit(1)


if __name__ == "__main__":
    main()
