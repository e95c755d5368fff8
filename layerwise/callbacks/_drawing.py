"""Figures drawn off the training loop: one background thread per process renders them and hands the images over.

A callback that has results to draw calls :func:`draw_later` with a function that builds the figures from those
results (already computed, global, on the host). The worker thread builds each figure with matplotlib's object API
(no pyplot: see :mod:`layerwise.figures.style`), renders it with Agg to an RGB array, and logs it as an image at the
global step the results belong to. The training loop only enqueues: the queue is bounded (``MAX_PENDING`` epochs of
figures), so a loop that outruns the drawing waits for a slot rather than piling up figures in memory.

:func:`wait_for_figures` blocks until every enqueued figure is logged. The callbacks call it in ``teardown`` (a fit,
validate or test that ends normally, before Lightning finalises the loggers) and in ``on_exception`` (an interrupted
run: figures already enqueued are still drawn and logged, then the loggers close), so no figure is lost and nothing
hangs: a figure that fails to draw is skipped with a warning naming it.
"""

import queue
import threading
from collections.abc import Callable
from typing import Any, Optional

import numpy as np
from lightning.pytorch.utilities import rank_zero_warn

MAX_PENDING = 4

Job = Callable[[], None]
_queue: "Optional[queue.Queue[Job]]" = None
_thread: Optional[threading.Thread] = None
_lock = threading.Lock()


def _work() -> None:
    assert _queue is not None
    while True:
        job = _queue.get()
        try:
            job()
        except Exception as error:  # a figure must never take the run down: skip it, say which
            rank_zero_warn(f"layerwise: a figure could not be drawn and was skipped ({type(error).__name__}: {error})")
        finally:
            _queue.task_done()


def _jobs() -> "queue.Queue[Job]":
    global _queue, _thread
    with _lock:
        if _thread is None or not _thread.is_alive():
            _queue = queue.Queue(maxsize=MAX_PENDING)
            _thread = threading.Thread(target=_work, name="layerwise-figures", daemon=True)
            _thread.start()
        assert _queue is not None
        return _queue


def rendered(figure: Any) -> np.ndarray:
    """A matplotlib figure as an (H, W, 3) uint8 array, rendered with Agg at the figure's dpi (as ``add_figure``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = figure.canvas if isinstance(figure.canvas, FigureCanvasAgg) else FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def draw_later(experiment: Any, step: int, figures: Callable[[], dict[str, Any]]) -> None:
    """Build ``figures()`` (tag -> matplotlib figure) in the background and log each as an image at ``step``.

    ``experiment`` is a TensorBoard ``SummaryWriter`` (``add_image``). Returns at once unless ``MAX_PENDING`` jobs
    are already waiting.
    """

    def job() -> None:
        for tag, figure in figures().items():
            try:
                experiment.add_image(tag, rendered(figure), global_step=step, dataformats="HWC")
            finally:
                figure.clear()

    _jobs().put(job)


def wait_for_figures() -> None:
    """Block until every figure enqueued so far is drawn and logged (a no-op when nothing was enqueued)."""
    if _queue is not None and _thread is not None and _thread.is_alive():
        _queue.join()
