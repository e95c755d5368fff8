"""Figures drawn off the training loop: one background thread per process renders them and hands the images over.

A callback that has results to draw calls :func:`draw_later` with the image sinks of its trainer
(:func:`layerwise.callbacks._loggers.image_sinks`: TensorBoard, W&B, MLflow, PNG files) and a function that builds
the figures from those results (already computed, global, on the host). The worker thread builds each figure with
matplotlib's object API (no pyplot: see :mod:`layerwise.figures.style`), renders it once with Agg to an RGB array,
and hands that array to every sink at the global step the results belong to. A sink whose logger is not thread-safe
(W&B) gets its images on the main thread instead: the next :func:`draw_later` or :func:`wait_for_figures` delivers
them. The training loop only enqueues: the queue is bounded (``MAX_PENDING`` epochs of figures), so a loop that
outruns the drawing waits for a slot rather than piling up figures in memory.

:func:`wait_for_figures` blocks until every enqueued figure is logged. The callbacks call it in ``teardown`` (a fit,
validate or test that ends normally, before Lightning finalises the loggers) and in ``on_exception`` (an interrupted
run: figures already enqueued are still drawn and logged, then the loggers close), so no figure is lost and nothing
hangs: a figure that fails to draw is skipped with a warning naming it, and so is one that a logger refuses (the
other loggers still get it).
"""

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np
from lightning.pytorch.utilities import rank_zero_warn

MAX_PENDING = 4

Job = Callable[[], None]
_queue: "Optional[queue.Queue[Job]]" = None
_thread: Optional[threading.Thread] = None
_lock = threading.Lock()
# Images for the sinks that must be called on the main thread: (sink, tag, image, step), delivered there.
_for_main_thread: "queue.SimpleQueue[tuple[Any, str, np.ndarray, int]]" = queue.SimpleQueue()


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


def draw_later(sinks: Sequence[Any], step: int, figures: Callable[[], dict[str, Any]]) -> None:
    """Build ``figures()`` (tag -> matplotlib figure) in the background, render each once and log it at ``step``.

    ``sinks`` are :class:`~layerwise.callbacks._loggers.ImageSink`; images for those ``on_main_thread`` wait for the
    next call of this function or of :func:`wait_for_figures`, which deliver them. Returns at once unless
    ``MAX_PENDING`` jobs are already waiting.
    """
    deliver_on_main_thread()
    if not sinks:
        return

    def job() -> None:
        for tag, figure in figures().items():
            try:
                image = rendered(figure)
            finally:
                figure.clear()
            for sink in sinks:
                if sink.on_main_thread:
                    _for_main_thread.put((sink, tag, image, step))
                else:
                    _deliver(sink, tag, image, step)

    _jobs().put(job)


def _deliver(sink: Any, tag: str, image: np.ndarray, step: int) -> None:
    try:
        sink.log(tag, image, step)
    except Exception as error:  # one logger refusing an image must not keep it from the others, nor stop the run
        rank_zero_warn(
            f"layerwise: the figure {tag!r} could not be logged to {sink.name} and was skipped there "
            f"({type(error).__name__}: {error})"
        )


def deliver_on_main_thread() -> None:
    """Log the images rendered for the sinks that are not thread-safe (call on the main thread)."""
    while True:
        try:
            item = _for_main_thread.get_nowait()
        except queue.Empty:
            return
        _deliver(*item)


def wait_for_figures() -> None:
    """Block until every figure enqueued so far is drawn and logged by every sink (a no-op when nothing was enqueued).

    Call on the main thread: it also delivers the images of the sinks that are not thread-safe.
    """
    if _queue is not None and _thread is not None and _thread.is_alive():
        _queue.join()
    deliver_on_main_thread()
