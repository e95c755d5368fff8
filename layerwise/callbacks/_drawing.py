"""Figures drawn off the training loop: a drawing process builds and renders them, a thread hands the images over.

A callback that has results to draw calls :func:`draw_later` with the image sinks of its trainer
(:func:`layerwise.callbacks._loggers.image_sinks`: TensorBoard, W&B, MLflow, PNG files) and a :class:`FigureJob`: a
picklable recipe (a function and its plain arguments: the results, already computed, global, on the host) that
builds the figures. One background thread per process takes the jobs in order, has each built and rendered with Agg
to RGB arrays and hands the arrays to every sink at the global step the results belong to.

Where the figures are built and rendered: in a separate drawing process (one per training process that draws, a
fresh interpreter started on the first job: ``python -c``, so neither a fork of the training process nor a re-run
of its ``__main__``). Building and rendering a figure is pure Python and C under the GIL; in a thread of the
training process it would hold the GIL for most of a second per epoch, and every torch call of the training loop
releases the GIL and must win it back, waiting up to the interpreter's switch interval (5 ms) each time while the
drawing runs. The thread here only waits on the process's pipe and logs the arrays. The process runs at the lowest
priority (``nice 19``) with one thread, so that it takes only cores the training leaves idle.

Which way a run draws (:func:`figures_in_process`): in the process, on every device. A drawing thread costs the
loop the most where the loop is the host launching work (a GPU training loop ran 3.7x slower while a thread drew,
0.88x while the process drew), and on a CPU it stalls the loop too: CPU training steps 1.69x (thread) against 0.98x
(process), and a quickstart validation that draws 1.01-2.16x one that does not with the thread, 0.95-1.06x with the
process (2-core VM, ``benchmarks/RESULTS.md``, ``callback_overhead.py``). Where the training keeps every core busy,
drawing costs CPU time either way (a 10-epoch 2-core fit that drew every epoch: 1.69-1.76x the fit without the
analysis with the thread, 1.81-1.82x with the process, whose start is part of it).
``LAYERWISE_FIGURES=process|thread`` overrides the choice (``thread``, e.g., to step through a figure method in a
debugger). A job that cannot travel (a figure function defined in a script's ``__main__``, a plain callable) or a
drawing process that cannot start or died is drawn in the thread instead, with one warning.

A sink whose logger is not thread-safe (W&B) gets its images on the main thread instead: the next
:func:`draw_later` or :func:`wait_for_figures` delivers them. The training loop only enqueues: the queue is bounded
(``MAX_PENDING`` epochs of figures), so a loop that outruns the drawing waits for a slot rather than piling up
figures in memory.

:func:`wait_for_figures` blocks until every enqueued figure is logged. The callbacks call it in ``teardown`` (a fit,
validate or test that ends normally, before Lightning finalises the loggers) and in ``on_exception`` (an interrupted
run: figures already enqueued are still drawn and logged, then the loggers close), so no figure is lost and nothing
hangs: a figure that fails to draw is skipped with a warning naming it, and so is one that a logger refuses (the
other loggers still get it).
"""

import atexit
import os
import pickle
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import numpy as np
from lightning.pytorch.utilities import rank_zero_warn

from layerwise.errors import LayerwiseWarning
from layerwise.figures.worker import FigureJob, Image, build_and_render, read_frame, write_frame

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
            try:
                _skipped(None, error)
            except Exception as warned:  # the warning made an error (-W error): this thread must live on, the
                # run waits on its queue; nothing up the stack can take it here, so it is printed
                print(f"layerwise: {type(warned).__name__}: {warned}", file=sys.stderr)
        finally:
            _queue.task_done()


def _skipped(tag: Optional[str], error: Union[BaseException, str]) -> None:
    what = "a figure" if tag is None else f"the figure {tag!r}"
    cause = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    rank_zero_warn(f"layerwise: {what} could not be drawn and was skipped ({cause})", category=LayerwiseWarning)


def _jobs() -> "queue.Queue[Job]":
    global _queue, _thread
    with _lock:
        if _thread is None or not _thread.is_alive():
            _queue = queue.Queue(maxsize=MAX_PENDING)
            _thread = threading.Thread(target=_work, name="layerwise-figures", daemon=True)
            _thread.start()
        assert _queue is not None
        return _queue


class _Unsent(Exception):
    """The job could not be drawn in the process: draw it in the thread (``failed``: it ran there and raised)."""

    def __init__(self, reason: str, failed: bool = False) -> None:
        super().__init__(reason)
        self.failed = failed


class _DrawingProcess:
    """The drawing process: a fresh interpreter that builds and renders the jobs it reads from its stdin."""

    def __init__(self) -> None:
        path = os.pathsep.join([entry or os.getcwd() for entry in sys.path] + [os.environ.get("PYTHONPATH", "")])
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from layerwise.figures.worker import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # one thread: the figures need no parallel kernels, and idle OpenMP workers spinning beside the training
            # would take its cores
            env={**os.environ, "PYTHONPATH": path, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
            # its own session: a Ctrl-C at the terminal is the training process's alone (it would otherwise reach
            # this one while it still imports, before serve() ignores SIGINT); it ends at EOF on its stdin
            start_new_session=True,
        )

    def draw(self, job: FigureJob) -> list[tuple[str, Image]]:
        try:
            payload = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:
            raise _Unsent(f"{type(error).__name__}: {error}") from error
        assert self.process.stdin is not None and self.process.stdout is not None
        write_frame(self.process.stdin, payload)
        reply = pickle.loads(read_frame(self.process.stdout))  # waits on the pipe, without the GIL
        if isinstance(reply, tuple) and reply and reply[0] in ("unsent", "failed"):
            raise _Unsent(reply[1], failed=reply[0] == "failed")
        return reply

    def close(self) -> None:
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
            self.process.wait(timeout=10)
        except Exception:
            self.process.kill()


_process: Optional[_DrawingProcess] = None
_process_failed = False
_warned_jobs: set[str] = set()
drawn = {"process": 0, "thread": 0}  # how many jobs each way drew (for tests and curious users)


def _draw_in_process(job: FigureJob) -> Optional[list[tuple[str, Image]]]:
    """The job's images from the drawing process, or None when it must be drawn in this thread instead."""
    global _process, _process_failed
    if _process_failed:
        return None
    try:
        if _process is None or _process.process.poll() is not None:
            _process = _DrawingProcess()
        return _process.draw(job)
    except _Unsent as unsent:  # e.g. a function of a script's __main__, or a figure method reading a tensor
        name = _job_name(job)
        if name not in _warned_jobs:
            _warned_jobs.add(name)
            where = "failed in" if unsent.failed else "cannot travel to"
            rank_zero_warn(
                f"layerwise: {name} {where} the drawing process ({unsent}), so its figures are drawn in a "
                "thread of the training process, which slows its loop while they are drawn. Define figure functions "
                "in an importable module (not in the script run), reading only their results and the plain settings "
                "(numbers, strings) of their object.",
                category=LayerwiseWarning,
            )
        return None
    except (OSError, EOFError, pickle.UnpicklingError) as error:  # could not start, or died: draw here from now on
        _process_failed = True
        rank_zero_warn(
            "layerwise: the drawing process is unavailable, so figures are drawn in a thread of the training "
            f"process from now on, which slows its loop while they are drawn ({type(error).__name__}: {error})",
            category=LayerwiseWarning,
        )
        return None


def _job_name(job: FigureJob) -> str:
    """What a warning calls a job: the figure function among its arguments that cannot travel, else its function."""
    functions = []
    for arg in job.args:
        if isinstance(arg, FigureJob):  # a wrapper: name what it wraps
            return _job_name(arg)
        for item in arg if isinstance(arg, (tuple, list)) else (arg,):  # the analyses' figure functions
            if callable(item) and hasattr(item, "__qualname__"):
                functions.append(item)
    for function in functions:
        try:
            pickle.dumps(function)
        except Exception:  # noqa: BLE001 - any reason it cannot travel
            return f"{function.__module__}.{function.__qualname__}"
    return getattr(job.function, "__qualname__", repr(job.function))


@atexit.register
def _close_process() -> None:
    if _process is not None:
        _process.close()


def figures_in_process() -> bool:
    """Whether figures are drawn in the drawing process (else in the thread).

    ``LAYERWISE_FIGURES`` when it is ``process`` or ``thread``, else (``auto``, unset) in the process.
    """
    choice = os.environ.get("LAYERWISE_FIGURES", "auto")
    if choice not in ("auto", "process", "thread"):
        raise ValueError(f"LAYERWISE_FIGURES={choice!r} must be 'process', 'thread' or 'auto'.")
    return choice != "thread"


def draw_later(sinks: Sequence[Any], step: int, figures: Callable[[], dict[str, Any]], in_process: bool = True) -> None:
    """Build ``figures()`` (tag -> matplotlib figure) off the training loop, render each once and log it at ``step``.

    With ``in_process``, a :class:`FigureJob` is built and rendered in the drawing process; any other callable (or
    a job that cannot travel), and every job without ``in_process``, in the background thread. ``sinks`` are
    :class:`~layerwise.callbacks._loggers.ImageSink`; images for those ``on_main_thread`` wait for the next call of
    this function or of :func:`wait_for_figures`, which deliver them. Returns at once unless ``MAX_PENDING`` jobs
    are already waiting.
    """
    deliver_on_main_thread()
    if not sinks:
        return

    def job() -> None:
        images = _draw_in_process(figures) if in_process and isinstance(figures, FigureJob) else None
        if images is None:
            here = figures.here if isinstance(figures, FigureJob) else None
            images = build_and_render(here or figures)
            drawn["thread"] += 1
        else:
            drawn["process"] += 1
        for tag, image in images:
            if isinstance(image, str):
                _skipped(tag, image)
                continue
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
            f"({type(error).__name__}: {error})",
            category=LayerwiseWarning,
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
