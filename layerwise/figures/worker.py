"""The drawing process: a fresh interpreter that builds and renders figures, importing no torch.

:mod:`layerwise.callbacks._drawing` starts it (``python -c "from layerwise.figures.worker import serve; serve()"``)
and writes it :class:`FigureJob` frames on its stdin: a module-level figure function and its plain, JSON-ready
arguments (a validation's summary, a stage). It builds the figures, renders each with Agg to an RGB array and writes
the arrays back on its stdout, one frame per job, until its stdin closes. It needs numpy and matplotlib only: the
jobs hold no tensor, no callback and no metric, so unpickling them imports the figure functions' modules and
nothing of the training process (``tests/callbacks/test_drawing.py`` checks that torch, Lightning and torchmetrics
stay out).

What it may call is decided by the training process, which is code: the jobs come only from its pipe, and a job's
figure functions are the function objects the callbacks of that process hold (pickled by reference), never names
read from a summary file; a summary's other names are skipped (:mod:`layerwise.figures.registry`).
"""

import os
import pickle
import signal
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, Optional, Union

import numpy as np


def rendered(figure: Any) -> np.ndarray:
    """A matplotlib figure as an (H, W, 3) uint8 array, rendered with Agg at the figure's dpi (as ``add_figure``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = figure.canvas if isinstance(figure.canvas, FigureCanvasAgg) else FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


@dataclass(frozen=True)
class FigureJob:
    """A picklable recipe of figures: ``function(*args)`` returns ``{tag: matplotlib figure}``.

    ``function`` is a module-level function (or a method of a class importable by its module path); ``args`` are
    plain data on the host (results, layer numbers, the plain settings of the object that owns a figure method).
    ``here`` (not pickled) builds the same figures from the original objects: what the background thread draws
    when the job cannot be drawn in the drawing process.
    """

    function: Callable[..., dict[str, Any]]
    args: tuple = ()
    here: Optional[Callable[[], dict[str, Any]]] = None

    def __call__(self) -> dict[str, Any]:
        return self.function(*self.args)

    def __reduce__(self) -> tuple[Any, tuple]:
        return (FigureJob, (self.function, self.args))


Image = Union[np.ndarray, str]  # a rendered figure, or why it could not be drawn


def build_and_render(figures: Callable[[], dict[str, Any]]) -> list[tuple[str, Image]]:
    """Build the figures and render each once (a figure that fails becomes the reason, the others still render)."""
    images: list[tuple[str, Image]] = []
    for tag, figure in figures().items():
        try:
            images.append((tag, rendered(figure)))
        except Exception as error:
            images.append((tag, f"{type(error).__name__}: {error}"))
        finally:
            figure.clear()
    return images


def write_frame(stream: IO[bytes], payload: bytes) -> None:
    """Write ``payload`` as one frame: its length (8 bytes, little-endian), then the bytes."""
    stream.write(struct.pack("<Q", len(payload)))
    stream.write(payload)
    stream.flush()


def read_frame(stream: IO[bytes]) -> bytes:
    """Read one frame written by :func:`write_frame`; ``EOFError`` when the stream closed first."""
    header = stream.read(8)
    if len(header) < 8:
        raise EOFError("the drawing process closed its pipe")
    (size,) = struct.unpack("<Q", header)
    payload = stream.read(size)
    if len(payload) < size:
        raise EOFError("the drawing process closed its pipe")
    return payload


def serve() -> None:
    """The drawing process's loop: read a job, build and render its figures, write the images back; stop at EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle; EOF stops this one
    if hasattr(os, "nice"):  # where the cores are all busy training, the figures wait, not the training
        os.nice(19)
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print must not corrupt the replies
    jobs = sys.stdin.buffer
    while True:
        try:
            payload = read_frame(jobs)
        except EOFError:
            return
        try:
            job = pickle.loads(payload)
        except Exception as error:
            reply: Any = ("unsent", f"{type(error).__name__}: {error}")
        else:
            try:
                reply = build_and_render(job)
            except Exception as error:
                reply = ("failed", f"{type(error).__name__}: {error}")
        write_frame(replies, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
