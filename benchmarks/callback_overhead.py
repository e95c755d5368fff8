"""Validation-epoch cost of the analysis callbacks, measured side by side in one process.

Two cases:

- ``quickstart``: the quickstart ViT (vit_tiny_patch16_224 cut down to 8x8 digits: d=64, L=6, 4 heads, 10 classes)
  on the 360-image digits validation split;
- ``deit_s``: a DeiT-S-sized ViT (deit_small_patch16_224: d=384, L=12, 6 heads, 224x224, 1000 classes) on random
  images (weights random too: only shapes matter for the cost).

For each case every configuration gets its own Trainer (``logger=False``, no progress bar, no model summary, JSON
summaries in a temporary directory). One warm-up run, then ``--repeats`` rounds that run every configuration once,
in turn, so background load hits all of them alike. Reported per configuration, as medians over the rounds:

- ``epoch s``: ``on_validation_epoch_start`` of the first callback to ``on_validation_epoch_end`` of the last
  (forward passes, data loading and the analysis work); ``ratio`` is against the run without callbacks;
- ``hooks s``: seconds spent inside the analysis callback's own hooks, split into ``begin`` (state allocation and
  reset), ``batches`` (metric updates) and ``finish`` (compute, JSON). This is the callback's cost measured directly,
  so it stays meaningful when other processes make the epoch times noisy.

For DeiT-S, the four analyses (LayerSimilarityMonitor, LogitLensMonitor, NeuralCollapseMonitor,
EffectiveDepthMonitor), each in a LayerwiseAnalysis of its own, run together in one more Trainer and each is timed on
its own, and a last table times every
metric's ``update``/``compute``/``reset`` on random features of the DeiT-S shapes, without the model.

    .venv/bin/python benchmarks/callback_overhead.py                    # both cases, a few minutes on 2 CPU cores
    .venv/bin/python benchmarks/callback_overhead.py --quick            # tiny sizes, a smoke run
    .venv/bin/python benchmarks/callback_overhead.py --device cuda --num-samples 1024
"""

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import load_now, record  # noqa: E402

from layerwise.callbacks import (
    EffectiveDepthMonitor,
    LayerSimilarityMonitor,
    LayerwiseAnalysis,
    LogitLensMonitor,
    NeuralCollapseMonitor,
    _loader,
)
from layerwise.datamodules import DigitsDataModule
from layerwise.features import TimmViT
from layerwise.lightning_modules import Standard
from layerwise.metrics import (
    EarlyExit,
    LayerAccuracy,
    LayerCKA,
    LayerCosineSimilarity,
    LayerNC1,
    MinibatchCKA,
    SaturationCosine,
    SaturationHistogram,
    saturation_layers,
)

QUICKSTART_BACKBONE = dict(
    model_name="vit_tiny_patch16_224",
    img_size=8,
    patch_size=2,
    in_chans=1,
    embed_dim=64,
    depth=6,
    num_heads=4,
    num_classes=10,
)
DEIT_S_BACKBONE = dict(model_name="deit_small_patch16_224", num_classes=1000)
PARTS = ("begin", "batches", "finish")
HOOK_PARTS = {
    "on_validation_epoch_start": "begin",
    "on_validation_batch_start": "batches",
    "on_validation_batch_end": "batches",
    "on_validation_epoch_end": "finish",
}


def _synchronizer(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


class _Clock(Callback):
    """Reads the time at the start (put it first) or at the end (put it last) of every validation epoch."""

    def __init__(self, marks: list[float], at: str, synchronize: Callable[[], None]) -> None:
        self.marks, self.at, self.synchronize = marks, at, synchronize

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.at == "start":
            self.synchronize()
            self.marks.append(time.perf_counter())

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.at == "end":
            self.synchronize()
            self.marks.append(time.perf_counter())

    @property
    def state_key(self) -> str:
        return f"_Clock[{self.at}]"


def _time_hooks(callback: LayerwiseAnalysis, seconds: dict[str, float], synchronize: Callable[[], None]) -> None:
    """Wrap the callback's validation hooks (on the instance) so that they add their duration to ``seconds``."""
    for hook, part in HOOK_PARTS.items():
        original = getattr(callback, hook)

        def timed(*args: Any, _original: Callable = original, _part: str = part, **kwargs: Any) -> None:
            synchronize()
            start = time.perf_counter()
            _original(*args, **kwargs)
            synchronize()
            seconds[_part] += time.perf_counter() - start

        setattr(callback, hook, timed)


_FINISH: Optional[dict[str, float]] = None  # where the epoch-end parts of the running configuration add up


def _timed(owner: Any, name: str, label: str, synchronize: Callable[[], None]) -> None:
    """Replace ``owner.name`` by a wrapper adding its duration (device work included) to ``_FINISH[label]``."""
    original = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        if _FINISH is None:
            return original(*args, **kwargs)
        synchronize()
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            synchronize()
            _FINISH[label] = _FINISH.get(label, 0.0) + time.perf_counter() - start

    setattr(owner, name, timed)


_PATCHED_MODULE_PARTS = False


def _time_finish_parts(monitor: LayerwiseAnalysis, synchronize: Callable[[], None]) -> None:
    """Time the parts of the epoch end: the reduction, each analysis's results, logging, the JSON, the figure queue."""
    global _PATCHED_MODULE_PARTS
    for analysis in monitor.analyses:
        _timed(analysis, "results", f"results of {type(analysis).__name__}", synchronize)
    if not _PATCHED_MODULE_PARTS:  # module-level: once, whichever configuration runs adds to its own _FINISH
        _PATCHED_MODULE_PARTS = True
        from layerwise.callbacks import _loader, lifecycle
        from layerwise.callbacks import analysis as runner

        _timed(_loader, "all_reduce_sum_states", "all-reduce", synchronize)
        _timed(_loader.LoaderState, "reduce", "reduce (all-reduce and every compute)", synchronize)
        _timed(lifecycle, "log_scalars", "log scalars (Lightning)", synchronize)
        _timed(lifecycle, "merge_summary", "write the JSON", synchronize)
        _timed(runner, "layer_table", "layer table", synchronize)
        _timed(lifecycle, "log_figures_later", "enqueue figures", synchronize)


@dataclass
class Config:
    """One side of the comparison: a Trainer with these analysis callbacks (none = the baseline)."""

    name: str
    monitors: dict[str, LayerwiseAnalysis]
    tensorboard: bool = False
    timed: bool = True  # time the monitors' hooks (on a GPU: a synchronisation around every hook, see _time_hooks)
    group_batches: Optional[int] = None  # batches fed to the metrics together (None: the default, GROUP_BATCHES)
    figures: Optional[str] = None  # LAYERWISE_FIGURES during this configuration's runs (None: as the environment says)
    trainer: Optional[Trainer] = None
    marks: list[float] = field(default_factory=list)
    hook_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    finish_seconds: dict[str, float] = field(default_factory=dict)
    finish_runs: list[dict[str, float]] = field(default_factory=list)
    epochs: list[float] = field(default_factory=list)
    totals: list[float] = field(default_factory=list)
    hooks: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def build(self, device: str, root_dir: str) -> None:
        synchronize = _synchronizer(device)
        for label, monitor in self.monitors.items() if self.timed else ():
            self.hook_seconds[label] = dict.fromkeys(PARTS, 0.0)
            _time_hooks(monitor, self.hook_seconds[label], synchronize)
            _time_finish_parts(monitor, synchronize)
        clocks = _Clock(self.marks, "start", synchronize), _Clock(self.marks, "end", synchronize)
        self.trainer = Trainer(
            accelerator="gpu" if device == "cuda" else "cpu",
            devices=1,
            logger=TensorBoardLogger(root_dir, name="tensorboard") if self.tensorboard else False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            callbacks=[clocks[0], *self.monitors.values(), clocks[1]],
            default_root_dir=root_dir,
        )

    def run(self, model: LightningModule, loader: DataLoader, record: bool = True) -> None:
        global _FINISH
        _FINISH = self.finish_seconds if self.timed and self.monitors else None
        self.marks.clear()
        self.finish_seconds.clear()
        for seconds in self.hook_seconds.values():
            seconds.update(dict.fromkeys(PARTS, 0.0))
        default_group, default_figures = _loader.GROUP_BATCHES, os.environ.get("LAYERWISE_FIGURES")
        _loader.GROUP_BATCHES = self.group_batches or default_group
        if self.figures is not None:
            os.environ["LAYERWISE_FIGURES"] = self.figures
        start = time.perf_counter()
        try:
            self.trainer.validate(model, loader, verbose=False)
        finally:
            _loader.GROUP_BATCHES = default_group
            if default_figures is None:
                os.environ.pop("LAYERWISE_FIGURES", None)
            else:
                os.environ["LAYERWISE_FIGURES"] = default_figures
        if record:
            self.totals.append(time.perf_counter() - start)
            self.epochs.append(self.marks[1] - self.marks[0])
            for label, seconds in self.hook_seconds.items():
                self.hooks.setdefault(label, []).append(dict(seconds))
            if self.finish_seconds:
                self.finish_runs.append(dict(self.finish_seconds))


def _median_hooks(runs: list[dict[str, float]]) -> dict[str, float]:
    parts = {part: statistics.median(run[part] for run in runs) for part in PARTS}
    parts["total"] = statistics.median(sum(run.values()) for run in runs)
    return parts


def measure(model: LightningModule, loader: DataLoader, configs: list[Config], repeats: int, device: str) -> None:
    """Warm every configuration up on one batch (builds its metric states), then run each once per round."""
    first_batch = DataLoader(Subset(loader.dataset, range(loader.batch_size)), batch_size=loader.batch_size)
    root = tempfile.mkdtemp(prefix="layerwise_bench_")
    try:
        for index, config in enumerate(configs):
            config.build(device, os.path.join(root, str(index)))
            config.run(model, first_batch, record=False)
        for _ in range(repeats):
            for config in configs:
                config.run(model, loader)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def print_table(title: str, configs: list[Config]) -> None:
    """One row per configuration; a configuration holding several monitors gets one more row per monitor."""
    baseline = statistics.median(configs[0].epochs)
    print(f"\n{title}")
    header = f"{'configuration':<38}{'epoch s':>9}{'(min-max)':>15}{'ratio':>8}{'hooks s':>9}"
    header += "".join(f"{part:>9}" for part in PARTS)
    print(header)
    print("-" * len(header))
    for config in configs:
        epoch = statistics.median(config.epochs)
        row = f"{config.name:<38}{epoch:>9.3f}{f'({min(config.epochs):.2f}-{max(config.epochs):.2f})':>15}"
        row += f"{epoch / baseline:>7.2f}x"
        hooks = {label: _median_hooks(runs) for label, runs in config.hooks.items()}
        if len(hooks) == 1:
            (single,) = hooks.values()
            row += "".join(f"{single[part]:>9.3f}" for part in ("total", *PARTS))
        elif hooks:
            row += f"{sum(h['total'] for h in hooks.values()):>9.3f}"
        print(row)
        for label, parts in hooks.items() if len(hooks) > 1 else ():
            print(f"{'  ' + label:<70}" + "".join(f"{parts[part]:>9.3f}" for part in ("total", *PARTS)))
        for label, value in _median_parts(config.finish_runs).items():
            print(f"{'    epoch end: ' + label:<62}{value:>9.3f} s")


# -------------------------------------------------------------------------------------------------------- cases
def _model(backbone: dict[str, Any], device: str) -> Standard:
    return Standard(backbone=TimmViT(**backbone)).to(device).eval()


def quickstart_case(args: argparse.Namespace) -> None:
    seed_everything(0, verbose=False)
    data = DigitsDataModule(batch_size=64)
    data.setup("validate")
    loader = data.val_dataloader()
    model = _model(QUICKSTART_BACKBONE, args.device)
    # Drawing is the one difference between the last two: the same logger, the one not drawing by log_figures=False.
    # (Without a logger the analysis still draws: its figures go to PNG files.)
    configs = [
        Config("off", {}),
        Config("off, TensorBoard logger", {}, tensorboard=True),
        Config(
            "LayerwiseAnalysis(log_figures=False), TB",
            {"LayerwiseAnalysis": LayerwiseAnalysis(log_figures=False)},
            tensorboard=True,
        ),
        Config("LayerwiseAnalysis(), TensorBoard", {"LayerwiseAnalysis": LayerwiseAnalysis()}, tensorboard=True),
        Config(
            "..., TensorBoard, drawing thread",
            {"LayerwiseAnalysis": LayerwiseAnalysis()},
            tensorboard=True,
            figures="thread",
        ),
    ]
    measure(model, loader, configs, args.quickstart_repeats, args.device)
    title = (
        f"(a) quickstart ViT (d=64, L=6, 10 classes), digits validation split: {len(loader.dataset)} samples, "
        f"batch {loader.batch_size}, {args.device}, median of {args.quickstart_repeats} rounds"
    )
    print_table(title, configs)
    off, analysis, drawing, thread = (statistics.median(config.epochs) for config in configs[1:])
    totals = statistics.median(configs[3].totals)
    print(
        f"a validation that draws its figures / one that does not: {drawing / analysis:.3f}x (epoch as the training "
        f"loop sees it; the drawing runs in the background: validate() incl. waiting for it {totals:.3f} s); "
        f"the analysis without figures / none (TensorBoard both): {analysis / off:.3f}x; drawn by a thread instead of "
        f"the drawing process: {thread / analysis:.3f}x"
    )
    if not args.quick:
        record(
            "callback_overhead_quickstart",
            {
                "draw_vs_no_draw_epoch_ratio": round(drawing / analysis, 3),
                "draw_thread_vs_no_draw_epoch_ratio": round(thread / analysis, 3),
                "analysis_vs_off_epoch_ratio": round(analysis / off, 3),
                "epoch_seconds_off": round(off, 4),
                "epoch_seconds_no_draw": round(analysis, 4),
                "epoch_seconds_draw": round(drawing, 4),
                "epoch_seconds_draw_thread": round(thread, 4),
                "validate_seconds_draw_incl_background": round(totals, 4),
                "rounds": args.quickstart_repeats,
            },
            LOAD_BEFORE,
            device=args.device,
        )


def _fit_quickstart(epochs: int, analysis: bool, root: str, figures: bool = True) -> float:
    """Seconds of one quickstart fit (AlternatingAligned, TensorBoard logger) with or without LayerwiseAnalysis."""
    from layerwise.lightning_modules import AlternatingAligned, WarmupCosineLR

    seed_everything(0, verbose=False)
    model = AlternatingAligned(
        backbone=TimmViT(**QUICKSTART_BACKBONE, pooling="mean"),
        label_smoothing=0.1,
        optimizer=lambda params: torch.optim.AdamW(params, lr=0.002, weight_decay=0.05),
        lr_scheduler=lambda optimizer: WarmupCosineLR(optimizer, warmup_epochs=min(2, epochs - 1), max_epochs=epochs),
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        logger=TensorBoardLogger(root, name="fit"),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        log_every_n_steps=10,
        callbacks=[LayerwiseAnalysis(log_figures=figures)] if analysis else [],
    )
    start = time.perf_counter()
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=64))
    return time.perf_counter() - start


def quickstart_fit_case(args: argparse.Namespace) -> None:
    """The user's view: a whole quickstart fit with the analysis drawing every epoch's figures, against none; the
    figures drawn by the drawing process (``LAYERWISE_FIGURES=process``) and by a thread (``thread``, a CPU run's
    default)."""
    configs = {
        "off": (False, False, False),
        "LayerwiseAnalysis(log_figures=False)": (True, False, False),
        "LayerwiseAnalysis(), drawing process": (True, True, False),
        "LayerwiseAnalysis(), drawing thread": (True, True, True),
    }
    times: dict[str, list[float]] = {name: [] for name in configs}
    root = tempfile.mkdtemp(prefix="layerwise_bench_fit_")
    try:
        for _ in range(args.fit_repeats):
            for name, (analysis, figures, thread) in configs.items():
                os.environ["LAYERWISE_FIGURES"] = "thread" if thread else "process"
                times[name].append(_fit_quickstart(args.fit_epochs, analysis, root, figures))
    finally:
        os.environ.pop("LAYERWISE_FIGURES", None)
        shutil.rmtree(root, ignore_errors=True)
    off = statistics.median(times["off"])
    print(
        f"\n(d) quickstart fit, {args.fit_epochs} epochs, TensorBoard logger both ways, LayerwiseAnalysis() with "
        f"figures every epoch, median of {args.fit_repeats} interleaved rounds"
    )
    print(f"{'configuration':<40}{'fit s':>9}{'(min-max)':>17}{'ratio':>8}")
    for name, runs in times.items():
        print(
            f"{name:<40}{statistics.median(runs):>9.2f}{f'({min(runs):.1f}-{max(runs):.1f})':>17}"
            f"{statistics.median(runs) / off:>7.3f}x"
        )
    if not args.quick:
        no_figures, process, thread = (statistics.median(times[name]) for name in list(configs)[1:])
        record(
            "callback_overhead_quickstart_fit",
            {
                "epochs": args.fit_epochs,
                "fit_seconds_off": round(off, 1),
                "fit_seconds_analysis_no_figures": round(no_figures, 1),
                "fit_seconds_analysis_process": round(process, 1),
                "fit_seconds_analysis_thread": round(thread, 1),
                "ratio_process": round(process / off, 3),
                "ratio_thread": round(thread / off, 3),
                "ratio_analysis_no_figures": round(no_figures / off, 3),
                "rounds": args.fit_repeats,
            },
            LOAD_BEFORE,
        )


def _summary_figures_of(path: str) -> dict[str, Any]:
    """The figures of one summary JSON (a FigureJob's function: importable by the drawing process)."""
    from layerwise.figures.summary import summary_figures
    from layerwise.results import load_summary

    return summary_figures(load_summary(Path(path)))


def drawing_case(args: argparse.Namespace) -> None:
    """What drawing costs the training loop that runs meanwhile: the figures of one quickstart validation drawn
    by a thread of the training process (how layerwise drew until 2026-11-26) or by the drawing process (now), while
    the main thread runs training steps of the quickstart ViT (2 torch threads) or a loop of small torch calls
    (what a GPU training step looks like to the host: launches). Side by side, alternating, medians."""
    from layerwise.callbacks import _drawing
    from layerwise.callbacks._loggers import ImageSink
    from layerwise.results import find_summaries

    seed_everything(0, verbose=False)
    root = tempfile.mkdtemp(prefix="layerwise_bench_draw_")
    data = DigitsDataModule(batch_size=64)
    data.setup("fit")
    device = args.device
    synchronize = _synchronizer(device)
    model = _model(QUICKSTART_BACKBONE, device).train()
    Trainer(
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[LayerwiseAnalysis(log_figures=False, print_table=False)],
        default_root_dir=root,
    ).validate(model, data.val_dataloader(), verbose=False)
    summary = str(find_summaries(Path(root), stage="val")[-1])
    model.to(device).train()  # the Trainer hands the model back on the CPU
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images, labels = (tensor.to(device) for tensor in next(iter(data.train_dataloader())))
    small = torch.randn(64, 64, device=device)

    def train_steps() -> None:
        for _ in range(args.drawing_steps):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
        synchronize()

    def small_calls() -> None:
        for _ in range(20000):
            small.add(1.0)
        synchronize()

    sink = [ImageSink("null", lambda tag, image, step: None)]
    jobs: dict[str, Optional[Callable[[], dict[str, Any]]]] = {
        "no drawing": None,
        "drawn by a thread": lambda: _summary_figures_of(summary),
        # by its module's name, not __main__'s: the drawing process imports it
        "drawn by the drawing process": _drawing.FigureJob(_importable(_summary_figures_of), (summary,)),
    }
    _drawing.draw_later(sink, 0, jobs["drawn by the drawing process"])  # start the process before timing
    _drawing.wait_for_figures()
    assert _drawing.drawn["process"] == 1, "the drawing process did not draw the job"
    loops = {"training steps": train_steps, "small torch calls": small_calls}
    times: dict[tuple[str, str], list[float]] = {(loop, job): [] for loop in loops for job in jobs}
    drawing: dict[str, list[float]] = {job: [] for job in jobs}
    for _ in range(args.drawing_repeats):
        for loop_name, loop in loops.items():
            for job_name, job in jobs.items():
                start = time.perf_counter()
                if job is not None:
                    _drawing.draw_later(sink, 0, job)
                loop()
                times[loop_name, job_name].append(time.perf_counter() - start)
                _drawing.wait_for_figures()
                drawing[job_name].append(time.perf_counter() - start)
    count = _count_figures(summary)
    shutil.rmtree(root, ignore_errors=True)
    print(
        f"\n(e) the training loop while one quickstart validation's figures are drawn ({count} "
        f"figures), {device}, {torch.get_num_threads()} torch threads, median of {args.drawing_repeats} rounds"
    )
    print(f"{'loop':<20}{'drawing':<32}{'loop s':>9}{'ratio':>8}{'until drawn s':>15}")
    ratios = {}
    for loop_name in loops:
        base = statistics.median(times[loop_name, "no drawing"])
        for job_name in jobs:
            loop_s = statistics.median(times[loop_name, job_name])
            ratios[loop_name, job_name] = loop_s / base
            until = statistics.median(drawing[job_name])
            print(f"{loop_name:<20}{job_name:<32}{loop_s:>9.3f}{loop_s / base:>7.2f}x{until:>15.3f}")
    if not args.quick:
        record(
            "callback_overhead_drawing",
            {
                f"{loop.replace(' ', '_')}_ratio_{job.split()[-1]}": round(ratios[loop, job], 3)
                for loop in loops
                for job in jobs
                if job != "no drawing"
            }
            | {"rounds": args.drawing_repeats, "training_steps_per_loop": args.drawing_steps},
            LOAD_BEFORE,
            device=device,
        )


def _importable(function: Callable) -> Callable:
    """``function`` as an attribute of this file imported as a module (run as a script it lives in ``__main__``)."""
    import importlib

    return getattr(importlib.import_module(Path(__file__).stem), function.__name__)


def _count_figures(path: str) -> int:
    figures = _summary_figures_of(path)
    for figure in figures.values():
        figure.clear()
    return len(figures)


class _Cycled(Dataset):
    """``length`` samples that cycle through a few stored random images (an ImageNet-sized epoch in little memory;
    with random weights only the shapes matter for the cost)."""

    def __init__(self, images: Tensor, labels: Tensor, length: int) -> None:
        self.images, self.labels, self.length = images, labels, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.images[index % len(self.images)], self.labels[index]


def _deit_s_loader(args: argparse.Namespace) -> DataLoader:
    """Random images and labels in host memory (``--pool``: that many distinct images, cycled); ``--workers`` > 0:
    worker processes and pinned memory, as a user would load ImageNet onto a GPU (the main process only launches)."""
    stored = min(args.num_samples, args.pool or args.num_samples)
    images = torch.randn(stored, 3, 224, 224)
    labels = torch.randint(0, 1000, (args.num_samples,))
    workers = dict(num_workers=args.workers, persistent_workers=True) if args.workers else {}
    pin = args.workers > 0 and args.device == "cuda"
    return DataLoader(_Cycled(images, labels, args.num_samples), batch_size=args.batch_size, pin_memory=pin, **workers)


def deit_s_case(args: argparse.Namespace) -> None:
    seed_everything(0, verbose=False)
    loader = _deit_s_loader(args)
    model = _model(DEIT_S_BACKBONE, args.device)
    configs = [
        Config("off", {}),
        # the ratios: untimed (timing the hooks synchronises a GPU around each of them, which the loop never does)
        Config("LayerwiseAnalysis(log_figures=False)", {"a": LayerwiseAnalysis(log_figures=False)}, timed=False),
        Config("LayerwiseAnalysis(), TensorBoard", {"a": LayerwiseAnalysis()}, tensorboard=True, timed=False),
        # before the batches were fed in groups: each batch's updates on their own (the same code, groups of one)
        Config("... (log_figures=False), per batch", {"a": LayerwiseAnalysis(log_figures=False)}, False, False, 1),
    ]
    if not args.untimed_only:  # where the time goes: hooks and epoch-end parts timed (synchronised)
        timed = {"LayerwiseAnalysis": LayerwiseAnalysis(log_figures=False)}
        configs.append(Config("LayerwiseAnalysis(), hooks timed", timed))
    if not args.lean:
        off = dict(similarity=False, logit_lens=False, neural_collapse=False, depth=False, trajectory=False)
        standalone = {  # each analysis alone in a LayerwiseAnalysis of its own (the analyses are not callbacks)
            kind.__name__: LayerwiseAnalysis(**{**off, kind().name: kind()})
            for kind in (LayerSimilarityMonitor, LogitLensMonitor, NeuralCollapseMonitor, EffectiveDepthMonitor)
        }
        configs += [
            Config(
                "LayerwiseAnalysis(cka='minibatch')",
                {"LayerwiseAnalysis": LayerwiseAnalysis(similarity=LayerSimilarityMonitor(cka="minibatch"))},
            ),
            Config("4 analyses, each in its own LayerwiseAnalysis", standalone),
        ]
    measure(model, loader, configs, args.repeats, args.device)
    title = (
        f"(b) DeiT-S-sized ViT (d=384, L=12, 1000 classes), random 224x224 images: {args.num_samples} samples, "
        f"batch {args.batch_size}, {args.device}, loader workers {args.workers}, median of {args.repeats} rounds"
    )
    print_table(title, configs)
    off, watch, draw, per_batch = (statistics.median(config.epochs) for config in configs[:4])
    print(
        f"the full analysis / no analysis: {watch / off:.3f}x (fed per batch: {per_batch / off:.3f}x); a validation "
        f"that draws every figure (TensorBoard) / one that does not draw: {draw / watch:.3f}x"
    )
    if not args.quick:  # issue 24.1's second goal: <= 1.05x on a GPU
        record(
            "callback_overhead_deit_s",
            {
                "analysis_vs_off_epoch_ratio": round(watch / off, 3),
                "analysis_per_batch_vs_off_epoch_ratio": round(per_batch / off, 3),
                "draw_vs_no_draw_epoch_ratio": round(draw / watch, 3),
                "epoch_seconds_off": round(off, 4),
                "epoch_seconds_analysis": round(watch, 4),
                "epoch_seconds_analysis_drawing": round(draw, 4),
                "epoch_seconds_analysis_per_batch": round(per_batch, 4),
                "group_batches": _loader.GROUP_BATCHES,
                "epoch_end_seconds_timed": _median_parts(configs[4].finish_runs) if len(configs) > 4 else None,
                "distinct_images": min(args.num_samples, args.pool or args.num_samples),
                "num_samples": args.num_samples,
                "batch_size": args.batch_size,
                "loader_workers": args.workers,
                "rounds": args.repeats,
            },
            LOAD_BEFORE,
            device=args.device,
        )


def _median_parts(runs: list[dict[str, float]]) -> dict[str, float]:
    labels = runs[0] if runs else {}
    return {label: round(statistics.median(run.get(label, 0.0) for run in runs), 4) for label in labels}


def host_case(args: argparse.Namespace) -> None:
    """The host's share of the per-batch work: ``LayerwiseAnalysis()``'s updates at tiny shapes (12 layers, d 16, 10
    classes, batch 8), where the arithmetic is nothing and what is left is what a GPU run pays on the host for every
    batch (Python, dispatch, kernel launches); and how many torch operations a batch costs. The batches fed in groups
    (the default) and one at a time (groups of one, as before), alternated; on ``--device``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from layerwise.analyses.layer_spec import LayerSpec
    from layerwise.callbacks._loader import LoaderState

    class _Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.calls += 1
            return func(*args, **(kwargs or {}))

    layers, dim, classes, batch, batches, device = 12, 16, 10, 8, 64, args.device
    synchronize = _synchronizer(device)
    spec = LayerSpec(list(range(1, layers + 1)), layers, dim, classes)
    analysis = LayerwiseAnalysis()
    analysis.configure_analyses(None, spec)  # no trainer: no datamodule to read
    state = LoaderState.build(analysis.analyses, spec)
    for metric in state.metrics:
        metric.to(device)
    selection = torch.arange(layers, device=device)
    generator = torch.Generator().manual_seed(0)
    outputs = [
        {
            "features": torch.randn(layers, batch, dim, generator=generator).to(device),
            "logits": torch.randn(layers, batch, classes, generator=generator).to(device),
            "targets": torch.randint(0, classes, (batch,), generator=generator).to(device),
        }
        for _ in range(batches)
    ]
    default_group = _loader.GROUP_BATCHES
    settings = {"in groups": default_group, "per batch": 1}

    def epoch(group: int) -> None:
        _loader.GROUP_BATCHES = group
        try:
            for output in outputs:
                state.collect(output, selection, 1, False)
            state.feed_pending()
            state.reset()
            synchronize()
        finally:
            _loader.GROUP_BATCHES = default_group

    per_batch: dict[str, list[float]] = {name: [] for name in settings}
    for group in settings.values():
        epoch(group)
    for _ in range(args.host_repeats):
        for name, group in settings.items():
            start = time.perf_counter()
            epoch(group)
            per_batch[name].append((time.perf_counter() - start) / batches)
    operations, milliseconds = {}, {}
    for name, group in settings.items():
        counter = _Count()
        with counter:
            epoch(group)  # the batches are fed in groups: count a whole epoch's operations, per batch
        operations[name] = round(counter.calls / batches, 1)
        milliseconds[name] = round(1e3 * statistics.median(per_batch[name]), 3)
    print(
        f"\n(f) host time of the analysis per batch at tiny shapes (L={layers}, d={dim}, C={classes}, batch {batch}), "
        f"{device}, {torch.get_num_threads()} torch threads, median of {args.host_repeats} alternated epochs of "
        f"{batches} batches (groups of {default_group}):"
    )
    for name in settings:
        print(f"  {name:<10} {milliseconds[name]:.3f} ms, {operations[name]} torch operations per batch")
    if not args.quick:
        record(
            "callback_overhead_host",
            {
                "milliseconds": milliseconds["in groups"],
                "torch_operations": operations["in groups"],
                "milliseconds_per_batch_fed_alone": milliseconds["per batch"],
                "torch_operations_per_batch_fed_alone": operations["per batch"],
                "group_batches": default_group,
                "rounds": args.host_repeats,
            },
            LOAD_BEFORE,
            device=device,
        )


def metric_costs(args: argparse.Namespace) -> None:
    """Time every metric's update (per batch), compute and reset on random features of the DeiT-S shapes."""
    layers, dim, classes, batch, device = 12, 384, 1000, args.batch_size, args.device
    synchronize = _synchronizer(device)
    features = torch.randn(layers, batch, dim, device=device).cumsum(0)  # correlated layers, like a residual stream
    logits = torch.randn(layers, batch, classes, device=device) * 3
    targets = torch.randint(0, classes, (batch,), device=device)
    saturation = saturation_layers(logits.argmax(-1))
    every_class = torch.arange(classes, device=device)  # one sample of every class, fed once before compute
    every_class_features = torch.randn(layers, classes, dim, device=device).cumsum(0)
    metrics: dict[str, tuple[Any, tuple[Any, ...]]] = {
        "LayerCKA (exact)": (LayerCKA(layers, dim), (features,)),
        "MinibatchCKA": (MinibatchCKA(layers), (features,)),
        "LayerCosineSimilarity (centred)": (LayerCosineSimilarity(layers, dim=dim), (features,)),
        "LayerCosineSimilarity (uncentred)": (LayerCosineSimilarity(layers, center=False), (features,)),
        "SaturationCosine (centred)": (SaturationCosine(layers, dim=dim), (features, saturation)),
        "LayerNC1": (LayerNC1(layers, dim, classes), (features, targets)),
        f"LayerNC1, all {classes} classes seen": (LayerNC1(layers, dim, classes), (features, targets)),
        "LayerAccuracy": (LayerAccuracy(layers), (logits, targets)),
        "SaturationHistogram": (SaturationHistogram(layers), (logits,)),
        "EarlyExit": (EarlyExit(layers), (logits, targets)),
    }
    batches = max(1, args.num_samples // batch)

    def seconds(action: Callable[[], Any], times: int) -> float:
        """Median seconds of ``times`` calls."""
        durations = []
        for _ in range(times):
            synchronize()
            start = time.perf_counter()
            action()
            synchronize()
            durations.append(time.perf_counter() - start)
        return statistics.median(durations)

    def compute_afresh(metric: Any) -> None:
        metric.compute()  # layerwise metrics never cache compute() (compute_with_cache=False)

    print(
        f"\n(c) metric cost at the DeiT-S shapes (L={layers}, d={dim}, C={classes}), batch {batch}, {device}, "
        f"without the model; epoch = {batches} updates + compute + reset"
    )
    header = f"{'metric':<38}{'update ms/batch':>16}{'compute ms':>12}{'reset ms':>10}{'epoch ms':>10}"
    print(header)
    print("-" * len(header))
    with torch.inference_mode():
        for name, (metric, inputs) in metrics.items():
            metric.to(device)
            update = seconds(lambda m=metric, x=inputs: m.update(*x), 5)
            if name.startswith("LayerNC1,"):
                metric.update(every_class_features, every_class)
            compute = seconds(lambda m=metric: compute_afresh(m), 3)
            reset = seconds(metric.reset, 3)
            epoch = batches * update + compute + reset
            row = f"{1e3 * update:>16.1f}{1e3 * compute:>12.1f}{1e3 * reset:>10.1f}{1e3 * epoch:>10.1f}"
            print(f"{name:<38}{row}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-samples", type=int, default=128, help="random images of the DeiT-S case")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size of the DeiT-S case")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the DeiT-S case (medians over these)")
    parser.add_argument("--quickstart-repeats", type=int, default=9, help="rounds of the quickstart case")
    parser.add_argument("--fit-epochs", type=int, default=40, help="epochs of the quickstart-fit case")
    parser.add_argument("--fit-repeats", type=int, default=2, help="rounds of the quickstart-fit case")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda if available")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES), help="which tables to print")
    parser.add_argument("--workers", type=int, default=0, help="DeiT-S case: loader worker processes (pinned on a GPU)")
    parser.add_argument("--pool", type=int, default=0, help="DeiT-S case: distinct images, cycled (0: one per sample)")
    parser.add_argument("--untimed-only", action="store_true", help="DeiT-S case: skip the row that times the hooks")
    parser.add_argument("--lean", action="store_true", help="DeiT-S case: skip the minibatch-CKA and standalone rows")
    parser.add_argument("--host-repeats", type=int, default=9, help="host case: epochs (medians over these)")
    parser.add_argument("--drawing-steps", type=int, default=24, help="drawing case: training steps per loop")
    parser.add_argument("--drawing-repeats", type=int, default=5, help="drawing case: rounds")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: 8 DeiT-S samples, batch 4, 2 rounds each")
    args = parser.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.quick:
        args.num_samples, args.batch_size, args.repeats, args.quickstart_repeats = 8, 4, 2, 2
        args.fit_epochs, args.fit_repeats = 2, 1
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*is deprecated.*")
    gpu = f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"{torch.get_num_threads()} torch threads, device {args.device}{gpu}"
    )
    global LOAD_BEFORE
    LOAD_BEFORE = load_now()
    for case in args.cases:
        CASES[case](args)


LOAD_BEFORE: Optional[float] = None
CASES: dict[str, Callable[[argparse.Namespace], None]] = {
    "quickstart": quickstart_case,
    "quickstart_fit": quickstart_fit_case,
    "deit_s": deit_s_case,
    "metrics": metric_costs,
    "drawing": drawing_case,
    "host": host_case,
}

if __name__ == "__main__":
    main()
