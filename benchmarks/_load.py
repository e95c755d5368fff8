"""What the load benchmarks share: CPU-bound processes beside a run, and one timed quickstart fit in a fresh folder."""

import multiprocessing
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _busy() -> None:
    while True:
        pass


@contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """``count`` CPU-bound processes (a Python loop each) for the duration, stopped after."""
    workers = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(count)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        for worker in workers:
            worker.terminate()


def fit_seconds(config: Path, epochs: int, *extra: str) -> float:
    """Wall seconds of ``layerwise fit --config config`` cut to ``epochs`` (its schedule too), in a fresh folder."""
    command = [sys.executable, "-m", "layerwise", "fit", "--config", str(config), *extra]
    command += [f"--trainer.max_epochs={epochs}", f"--model.init_args.lr_scheduler.init_args.max_epochs={epochs}"]
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        result = subprocess.run(command, cwd=folder, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"the fit failed (rc {result.returncode}):\n{result.stderr[-3000:]}")
    return seconds
