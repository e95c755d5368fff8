"""How much of a DDP validation epoch the analysis spends synchronising its metrics: 2 CPU processes, gloo.

A DeiT-S-sized ViT (``deit_small_patch16_224``: d=384, L=12, 6 heads, 224x224, patch 16, 1000 classes; random
weights) validates random images with random labels on 2 processes started with Lightning's ``ddp_fork`` on CPU
(gloo, one intra-op thread per process; as in ``tests/callbacks/test_callbacks_ddp.py``). In every process, patched
in the parent before forking:

- ``all_reduce_sum_states`` as the callback calls it (``layerwise/callbacks/monitor.py``, ``_finish``): the whole call,
  i.e. packing every metric state into one float64 buffer, the ``all_reduce`` and writing the sums back (``states``),
  and the ``all_reduce`` inside it on its own (``reduce``);
- the second, small ``all_reduce`` of the centred cosine metrics (``LayerCosineSimilarity`` and
  ``SaturationCosine``: ``_SumStateMetric._all_reduce_if_global``, called from ``compute``) (``cos``);
- every other ``torch.distributed`` collective inside the epoch (``other``): Lightning's own, i.e. the barrier and
  all-reduce of each of the module's ``sync_dist=True`` logs (which the callback's read of ``trainer.callback_metrics``
  triggers) and the broadcast behind ``trainer.log_dir``.

``sync`` = ``states`` + ``cos``: the metric synchronisation. ``share`` = sync / epoch, the epoch running from
``on_validation_epoch_start`` of the first callback to ``on_validation_epoch_end`` of the last (forward passes, data
loading, metric updates, synchronisation, compute and the JSON summary; no figures: ``logger=False``).
A collective's time on one rank includes waiting for the other rank to arrive; the rank that arrives last waits
least, so the smaller of the two ranks' ``reduce`` is the closer figure for the transfer itself.

Every configuration (no callback, ``LayerwiseAnalysis()`` with exact CKA, the minibatch CKA:
``LayerwiseAnalysis(similarity=LayerSimilarityMonitor(cka='minibatch'))``) runs once per round, in turn (order reversed
every other round), each run one ``trainer.validate`` in freshly forked processes, so the metric states are built afresh
as in a run's first epoch. Medians over the rounds, per rank.

    .venv/bin/python benchmarks/ddp_sync.py                       # 128 images, batch 32, 3 rounds; ~3 min on 2 cores
    .venv/bin/python benchmarks/ddp_sync.py --quick               # 64x64 images, 32 samples, batch 8, 2 rounds
    .venv/bin/python benchmarks/ddp_sync.py --num-samples 256 --repeats 5
"""

import argparse
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import layerwise.callbacks.monitor as callback_base
import torch
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, TensorDataset

from layerwise.callbacks import LayerSimilarityMonitor, LayerwiseAnalysis
from layerwise.features import TimmViT
from layerwise.lightning_modules import Standard
from layerwise.metrics._base import _SumStateMetric

MODEL = "deit_small_patch16_224"
COLLECTIVES = ("all_reduce", "broadcast", "broadcast_object_list", "barrier", "all_gather", "all_gather_object")
PARTS = ("states", "reduce", "cos", "other", "finish")


class _Timings:
    """Per-process seconds of the instrumented calls since the last ``reset`` (each forked rank has its own copy)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.calls = dict.fromkeys(PARTS, 0)
        self.state_bytes = 0
        self.context: Optional[str] = None
        self.depth = 0
        self.start = time.perf_counter()

    def add(self, part: str, seconds: float) -> None:
        self.seconds[part] += seconds
        self.calls[part] += 1


TIMINGS = _Timings()


def _in_context(part: str, original: Callable) -> Callable:
    """Wrap ``original`` so that collectives called inside it are booked under ``part``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        previous, TIMINGS.context = TIMINGS.context, part
        try:
            return original(*args, **kwargs)
        finally:
            TIMINGS.context = previous

    return wrapper


def _timed_states(original: Callable) -> Callable:
    """The whole ``all_reduce_sum_states`` call (pack, all_reduce, unpack); its all_reduce is booked as ``reduce``."""
    inner = _in_context("reduce", original)

    def wrapper(metrics: Any, process_group: Optional[Any] = None) -> None:
        metrics = list(metrics)
        TIMINGS.state_bytes = sum(8 * getattr(m, attr).numel() for m in metrics for attr in m.sum_state_names)
        start = time.perf_counter()
        inner(metrics, process_group)
        TIMINGS.add("states", time.perf_counter() - start)

    return wrapper


def _timed_collective(original: Callable) -> Callable:
    """A ``torch.distributed`` collective booked under the current context (``other`` outside any)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if TIMINGS.depth:  # a collective called by another one (broadcast_object_list -> broadcast): counted once
            return original(*args, **kwargs)
        TIMINGS.depth += 1
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            TIMINGS.depth -= 1
            TIMINGS.add(TIMINGS.context or "other", time.perf_counter() - start)

    return wrapper


def instrument() -> None:
    """Patch the module attributes that the callback, the metrics and Lightning look up at call time."""
    callback_base.all_reduce_sum_states = _timed_states(callback_base.all_reduce_sum_states)
    _SumStateMetric._all_reduce_if_global = _in_context("cos", _SumStateMetric._all_reduce_if_global)
    for name in COLLECTIVES:
        setattr(dist, name, _timed_collective(getattr(dist, name)))


class _Clock(Callback):
    """First callback: resets the timings at epoch start. Last callback: writes this rank's record at epoch end."""

    def __init__(self, at: str, record: Optional[Path] = None) -> None:
        self.at, self.record = at, record

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.at == "start":
            TIMINGS.reset()

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.at == "end":
            epoch = time.perf_counter() - TIMINGS.start
            record = {"epoch": epoch, "state_bytes": TIMINGS.state_bytes, "seconds": TIMINGS.seconds}
            record["calls"] = TIMINGS.calls
            path = self.record.with_name(f"{self.record.name}_rank{trainer.global_rank}.json")
            path.write_text(json.dumps(record))

    @property
    def state_key(self) -> str:
        return f"_Clock[{self.at}]"


def _time_finish(callback: LayerwiseAnalysis) -> None:
    """Book the callback's ``on_validation_epoch_end`` (all-reduce, compute, JSON) as ``finish``."""
    original = callback.on_validation_epoch_end

    def timed(*args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        original(*args, **kwargs)
        TIMINGS.add("finish", time.perf_counter() - start)

    callback.on_validation_epoch_end = timed


@dataclass
class Config:
    """One side of the comparison: which analysis callback (None: no callback)."""

    name: str
    make: Optional[Callable[[], LayerwiseAnalysis]]


CONFIGS = [
    Config("off", None),
    Config("LayerwiseAnalysis()", lambda: LayerwiseAnalysis(log_figures=False)),
    Config(
        "LayerwiseAnalysis(cka='minibatch')",
        lambda: LayerwiseAnalysis(similarity=LayerSimilarityMonitor(cka="minibatch"), log_figures=False),
    ),
]


def run_once(config: Config, model: LightningModule, loader: DataLoader, root: Path, tag: str, processes: int) -> None:
    """One ``trainer.validate`` in ``processes`` freshly forked ranks; every rank writes ``<tag>_rank<r>.json``."""
    analysis = [] if config.make is None else [config.make()]
    for callback in analysis:
        _time_finish(callback)
    os.environ.pop("MASTER_PORT", None)  # a fresh free port for every launch
    trainer = Trainer(
        accelerator="cpu",
        devices=processes,
        strategy="ddp_fork",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        default_root_dir=str(root / tag),
        callbacks=[_Clock("start"), *analysis, _Clock("end", root / tag)],
    )
    trainer.validate(model, loader, verbose=False)


def read_records(root: Path, tag: str, processes: int) -> list[dict[str, Any]]:
    return [json.loads((root / f"{tag}_rank{rank}.json").read_text()) for rank in range(processes)]


def print_table(records: dict[str, list[list[dict[str, Any]]]], args: argparse.Namespace) -> None:
    print(
        f"\nValidation epoch on {args.processes} CPU processes (gloo, 1 thread each): {args.num_samples} random "
        f"{args.img_size}x{args.img_size} images ({args.num_samples // args.processes} per rank), batch "
        f"{args.batch_size}; median of {args.repeats} rounds; seconds"
    )
    header = (
        f"{'configuration':<36}{'rank':>5}{'epoch':>8}{'(min-max)':>15}{'finish':>8}{'states':>8}{'reduce':>8}"
        f"{'cos':>7}{'sync':>8}{'share':>8}{'other':>8}{'state MiB':>11}"
    )
    print(header)
    print("-" * len(header))
    for name, rounds in records.items():
        for rank in range(args.processes):
            runs = [round_records[rank] for round_records in rounds]
            epochs = [run["epoch"] for run in runs]

            def median(part: str, runs: list[dict[str, Any]] = runs) -> float:
                return statistics.median(run["seconds"][part] for run in runs)

            sync = statistics.median(run["seconds"]["states"] + run["seconds"]["cos"] for run in runs)
            share = statistics.median((run["seconds"]["states"] + run["seconds"]["cos"]) / run["epoch"] for run in runs)
            row = f"{name if rank == 0 else '':<36}{rank:>5}{statistics.median(epochs):>8.2f}"
            row += f"{f'({min(epochs):.2f}-{max(epochs):.2f})':>15}"
            row += "".join(f"{median(part):>8.3f}" for part in ("finish", "states", "reduce"))
            row += f"{median('cos'):>7.3f}{sync:>8.3f}{share:>7.1%} {median('other'):>8.3f}"
            row += f"{runs[0]['state_bytes'] / 2**20:>11.1f}"
            print(row)
    print(
        "\nfinish = the callback's on_validation_epoch_end; states = all_reduce_sum_states (pack + all_reduce + "
        "unpack); reduce = its all_reduce alone; cos = the centred cosines' second all_reduce; sync = states + cos; "
        "share = sync / epoch (median of the per-round shares); other = Lightning's collectives inside the epoch; "
        "state MiB = the float64 buffer reduced."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-samples", type=int, default=128, help="random images, split over the processes")
    parser.add_argument("--batch-size", type=int, default=32, help="images per batch and process")
    parser.add_argument("--img-size", type=int, default=224, help="image side (DeiT-S: 224)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (medians over these)")
    parser.add_argument("--processes", type=int, default=2, help="DDP processes")
    parser.add_argument("--quick", action="store_true", help="64x64 images, 32 samples, batch 8, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.img_size, args.num_samples, args.batch_size, args.repeats = 64, 32, 8, 2
    # One intra-op thread before any torch work, so the forked ranks never inherit a used OpenMP pool.
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*is deprecated.*")
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}, {os.cpu_count()} CPUs, {args.processes} "
        f"processes with {torch.get_num_threads()} torch thread each, gloo"
    )

    seed_everything(0, verbose=False)
    model = Standard(TimmViT(MODEL, num_classes=1000, img_size=args.img_size)).eval()
    backbone = model.backbone
    assert (backbone.num_layers, backbone.embed_dim, backbone.num_classes) == (12, 384, 1000)
    images = torch.randn(args.num_samples, 3, args.img_size, args.img_size)
    labels = torch.randint(0, 1000, (args.num_samples,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size)
    with torch.no_grad():  # warm the parent (and so every forked child) up
        model.layer_outputs((images[: args.batch_size], labels[: args.batch_size]))
    instrument()

    root = Path(tempfile.mkdtemp(prefix="layerwise_ddp_sync_"))
    records: dict[str, list[list[dict[str, Any]]]] = {config.name: [] for config in CONFIGS}
    try:
        for round_index in range(args.repeats):
            for index, config in enumerate(CONFIGS if round_index % 2 == 0 else reversed(CONFIGS)):
                tag = f"round{round_index}_{index}"
                run_once(config, model, loader, root, tag, args.processes)
                records[config.name].append(read_records(root, tag, args.processes))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(records, args)


if __name__ == "__main__":
    main()
