"""Shared pieces of the tests: a tiny timm ViT with a fitted head, digits batches, a quiet Trainer, summaries read
back, and forked process groups (``free_port``, ``run_forked``). Tiny models of the other families: ``tiny_models``.

The backbone is random, but its shared head is fitted in closed form (ridge regression on one-hot targets over the
features of every layer) and sharpened, so predictions differ between samples and layers and the softmax
confidences spread from 0.2 to 0.9: accuracy, saturation and early exit all see non-degenerate inputs without a
training loop (which costs tens of seconds on a loaded 2-core box).
"""

import copy
import functools
import importlib.util
import math
import shutil
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset

from layerwise.datamodules.digits import DigitsDataModule
from layerwise.features import TimmViT
from layerwise.lightning_modules import AlternatingAligned, Standard
from layerwise.results import summary_order

DEPTH, DIM, CLASSES = 4, 16, 10
HEAD_SCALE = 30.0

# Lightning's advice that a test shaped so on purpose does not follow; a test marked with one says why it applies.
ADVICE = "lightning.fabric.utilities.warnings.PossibleUserWarning"
TRAINING_ONLY = pytest.mark.filterwarnings(  # a fit with a validation_step and no validation data, on purpose
    f"ignore:You defined a `validation_step` but have no `val_dataloader`:{ADVICE}"
)
FROZEN_IN_EVAL = pytest.mark.filterwarnings(  # LinearProbes and Stitched keep their frozen models in eval mode
    rf"ignore:Found \d+ module\(s\) in eval mode at the start of training:{ADVICE}"
)


@functools.lru_cache(maxsize=1)
def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standardised digits: train images/labels and validation images/labels, ``(N, 1, 8, 8)`` and ``(N,)``."""
    datamodule = DigitsDataModule()
    datamodule.setup()
    return (*datamodule.train_set.tensors, *datamodule.val_set.tensors)


def val_loader(num_samples: int = 101, batch_size: int = 16) -> DataLoader:
    """The first ``num_samples`` validation digits in a fixed order (101 / 16: a ragged last batch of 5)."""
    _, _, x, y = digits()
    assert len(torch.unique(y[:num_samples])) == CLASSES, "every class must be present for NC1"
    return DataLoader(TensorDataset(x[:num_samples], y[:num_samples]), batch_size=batch_size)


def tiny_backbone(seed: int = 0) -> TimmViT:
    """Random tiny ViT (8x8 grey images, patch 2, 16 wide, 4 blocks, 2 heads, 10 classes)."""
    torch.manual_seed(seed)
    backbone = TimmViT(
        num_classes=CLASSES, img_size=8, patch_size=2, in_chans=1, embed_dim=DIM, depth=DEPTH, num_heads=2
    )
    assert (backbone.num_layers, backbone.embed_dim, backbone.num_classes) == (DEPTH, DIM, CLASSES)
    assert backbone.model.patch_embed.num_patches == 16 and backbone.model.patch_embed.proj.in_channels == 1
    return backbone


def train_loader(num_samples: int = 64, batch_size: int = 16) -> DataLoader:
    """The first ``num_samples`` training digits, shuffled."""
    x, y, _, _ = digits()
    return DataLoader(TensorDataset(x[:num_samples], y[:num_samples]), batch_size=batch_size, shuffle=True)


def fit_linear_head(head: torch.nn.Linear, features: torch.Tensor, targets: torch.Tensor) -> None:
    """Ridge fit of ``head`` to one-hot ``targets`` on ``(n, d)`` features, sharpened by ``HEAD_SCALE``."""
    with torch.no_grad():
        design = torch.cat([features.double(), torch.ones(len(features), 1, dtype=torch.float64)], dim=1)
        onehot = torch.nn.functional.one_hot(targets, head.out_features).double()
        # ridge: layer-normed features sum to zero, so the plain least-squares system is singular
        gram = design.T @ design + 1e-3 * len(design) * torch.eye(design.shape[1], dtype=torch.float64)
        solution = torch.linalg.solve(gram, design.T @ onehot)
        head.weight.copy_(HEAD_SCALE * solution[:-1].T)
        head.bias.copy_(HEAD_SCALE * solution[-1])


@functools.lru_cache(maxsize=1)
def _fitted_state() -> dict[str, torch.Tensor]:
    backbone = tiny_backbone().eval()
    x, y, _, _ = digits()
    with torch.no_grad():
        normed = backbone.model.norm(backbone(x[::3]))  # (L, n, d): one head fitted to every layer at once
    fit_linear_head(backbone.model.head, normed.reshape(-1, DIM), y[::3].repeat(DEPTH))
    return {key: value.clone() for key, value in backbone.state_dict().items()}


def fitted_backbone() -> TimmViT:
    """The tiny ViT with its fitted, sharpened head (deterministic; a fresh copy on every call)."""
    backbone = tiny_backbone()
    backbone.load_state_dict(_fitted_state())
    return backbone.eval()


def fitted_module() -> Standard:
    """A layerwise ``Standard`` module around :func:`fitted_backbone`, in train mode as a Trainer expects it at the
    start of fit (validate switches to eval itself); the tiny ViT has no dropout, so the two modes compute the same."""
    return Standard(fitted_backbone()).train()


def head64(backbone: TimmViT):
    """The backbone's own final norm + classifier in float64, as a function of ``(..., d)`` features."""
    copied = copy.deepcopy(backbone).double().eval()

    def apply(features: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return copied.head(torch.as_tensor(features, dtype=torch.float64))

    return apply


def trainer(root: Path, callbacks: list[Any], **kwargs: Any) -> pl.Trainer:
    """A quiet single-process CPU Trainer writing under ``root`` (no logger unless given)."""
    options = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(root),
        num_sanity_val_steps=0,
    )
    options.update(kwargs)
    return pl.Trainer(callbacks=callbacks, **options)


def summary_file(log_dir: Path, stage: str = "val", epoch: int = 0) -> Path:
    """The (last, by step) summary file the callbacks wrote for ``stage``/``epoch``."""
    files = sorted((Path(log_dir) / "layerwise").glob(f"{stage}_epoch_{epoch:03d}_step_*.json"), key=summary_order)
    assert files, f"no {stage} summary of epoch {epoch} under {log_dir}"
    return files[-1]


def read_summary(log_dir: Path, stage: str = "val", epoch: int = 0) -> dict[str, Any]:
    """The JSON summary the callbacks wrote for ``stage``/``epoch``, read through the one schema every reader uses."""
    from layerwise.results import load_summary

    return load_summary(summary_file(log_dir, stage, epoch))


def read_features(log_dir: Path, stage: str = "val", epoch: int = 0) -> dict[str, torch.Tensor]:
    """The ``save_features`` file for ``stage``/``epoch``."""
    path = summary_file(log_dir, stage, epoch)
    return torch.load(path.with_name(path.stem + "_features.pt"))


def assert_json_close(actual: Any, expected: Any, atol: float = 0.0, rtol: float = 0.0, where: str = "$") -> None:
    """Nested JSON values equal, floats within ``atol + rtol * |expected|``, ``None`` (NaN) only against ``None``.

    A summary's ``run_id`` (which run wrote it) is not a result and differs between runs by design: it is skipped.
    """
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and set(actual) == set(expected), f"{where}: keys {actual} != {expected}"
        for key in set(expected) - {"run_id"}:
            assert_json_close(actual[key], expected[key], atol, rtol, f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), f"{where}: {actual} != {expected}"
        for index, (item, reference) in enumerate(zip(actual, expected)):
            assert_json_close(item, reference, atol, rtol, f"{where}[{index}]")
    elif expected is None or actual is None:
        assert actual is None and expected is None, f"{where}: {actual} != {expected}"
    elif isinstance(expected, float) or isinstance(actual, float):
        assert math.isclose(actual, expected, rel_tol=rtol, abs_tol=atol), f"{where}: {actual} != {expected}"
    else:
        assert actual == expected, f"{where}: {actual} != {expected}"


class RecordingAlternating(AlternatingAligned):
    """Records, per training micro-batch, whether the aligned objective was used."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.objectives: list[str] = []

    def compute_loss(self, outputs):
        self.objectives.append("aligned" if self.step_number() % 2 == 0 else "last")
        return super().compute_loss(outputs)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, for a process group's ``MASTER_PORT``."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_forked(worker: Callable[..., None], args: tuple, nprocs: int = 2, timeout_s: float = 240) -> None:
    """``worker(rank, *args)`` in ``nprocs`` forked processes; the test fails (workers killed) past ``timeout_s``.

    Forked children inherit the imported modules, where spawned ones would re-import torch, Lightning and the rest
    (over 10 s each on a loaded 2-core box); a worker that raises fails the test with its traceback.
    """
    context = mp.start_processes(worker, args=args, nprocs=nprocs, join=False, start_method="fork")
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"workers did not finish within {timeout_s} s")


def ref_unbiased_hsic(x: np.ndarray, y: np.ndarray) -> float:
    """The unbiased HSIC estimator of Song et al. (2012) between two (n, d) feature sets, in numpy float64."""
    n = x.shape[0]
    k, m = x @ x.T, y @ y.T
    np.fill_diagonal(k, 0.0)
    np.fill_diagonal(m, 0.0)
    ones = np.ones(n)
    value = np.trace(k @ m) + (ones @ k @ ones) * (ones @ m @ ones) / ((n - 1) * (n - 2))
    value -= 2.0 / (n - 2) * (ones @ k @ m @ ones)
    return value / (n * (n - 3))


@functools.lru_cache(maxsize=1)
def memory_benchmark():
    """``benchmarks/_memory.py`` (the allocation tracker of the memory benchmarks), loaded from its file."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "_memory.py"
    spec = importlib.util.spec_from_file_location("layerwise_benchmarks_memory", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------- headless Chromium
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [  # no network beyond the page, nothing of a first run
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def playwright_or_skip():
    """playwright's sync API; the test is skipped, saying what to install, where Chromium or playwright is absent."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Chromium is absent (apt-get install chromium; .ci/run installs it)")
    return pytest.importorskip("playwright.sync_api", reason="playwright is absent (pip install -e '.[dev]')")


def chromium_context(playwright: Any, profile: Path) -> Any:
    """Headless Chromium with a fresh profile in ``profile`` and a 1300 x 900 viewport (close it when done)."""
    return playwright.chromium.launch_persistent_context(
        str(profile),
        executable_path=CHROMIUM,
        headless=True,
        args=CHROMIUM_FLAGS,
        viewport={"width": 1300, "height": 900},
    )


def quiet_trainer(steps: int, **kwargs: Any) -> pl.Trainer:
    """A CPU Trainer of ``steps`` steps that logs, prints and saves nothing (``kwargs`` override any option)."""
    options = dict(
        accelerator="cpu",
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        gradient_clip_val=1.0,
    )
    return pl.Trainer(**{**options, **kwargs})
