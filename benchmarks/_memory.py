"""Exact accounting of the memory a block of PyTorch code allocates, and the documented bounds of the chunked head.

:class:`MemoryTracker` measures two things at once while it is entered:

- **peak bytes**: the highest number of bytes allocated above what was allocated on entry. On CPU this comes from the
  profiler's allocator events (``profile_memory=True``): every allocation and free of the CPU allocator, in order,
  including the temporaries that kernels allocate internally (``logsumexp``'s float64 ``exp`` buffer, say) and
  those of autograd's backward pass and of checkpoint recomputation. On CUDA it is
  ``torch.cuda.max_memory_allocated()`` minus ``memory_allocated()`` on entry.
- **tensors**: every tensor any aten op returns, seen by a ``TorchDispatchMode`` (forward, backward, and the
  recomputation of checkpointed chunks, since autograd carries the mode into the backward pass): its op, shape,
  dtype and whether it owns a new storage. Each untyped storage is counted once (views and in-place results share
  their input's), and freed when its weak reference dies, which gives a second peak, ``op_peak_bytes``: the peak of
  the storages that ops return, without the temporaries that live inside one kernel.

The bounds at the end are what ``benchmarks/README.md`` documents for the shared head applied layer by layer and in
chunks of ``c`` rows (``layerwise.engines.readout``), vocabulary ``V``, width ``d``, ``L`` layers and
``N`` rows.
"""

import contextlib
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


@dataclass(frozen=True)
class TensorRecord:
    """A tensor an op returned: ``new`` when it owns a storage that did not exist before the op."""

    op: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    new: bool

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        shape = "x".join(map(str, self.shape)) or "scalar"
        return f"{shape} {str(self.dtype).removeprefix('torch.')} ({self.nbytes / 2**20:.1f} MiB, {self.op})"


class _OpTensors(TorchDispatchMode):
    """Records every tensor an op returns and keeps the bytes of the new storages alive (freed by weakref)."""

    def __init__(self, keep_all: bool) -> None:
        super().__init__()
        self.keep_all = keep_all
        self.records: list[TensorRecord] = []
        self.largest: Optional[TensorRecord] = None
        self.largest_new: Optional[TensorRecord] = None
        self.live: dict[int, tuple[weakref.ref, int]] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self.lock = threading.Lock()

    def _freed(self, key: int) -> None:
        with self.lock:
            entry = self.live.pop(key, None)
            if entry is not None:
                self.live_bytes -= entry[1]

    def _note(self, op: str, tensor: torch.Tensor, inputs: set[int]) -> None:
        new = False
        try:
            storage = tensor.untyped_storage()
        except (NotImplementedError, RuntimeError):  # no storage (sparse, nested, ...): shapes only
            storage = None
        if storage is not None and storage.device.type != "meta":
            key, nbytes = id(storage), storage.nbytes()
            with self.lock:
                if key in self.live:  # a storage seen before: in-place ops may have resized it
                    self.live_bytes += nbytes - self.live[key][1]
                    self.live[key] = (self.live[key][0], nbytes)
                elif key not in inputs:  # not a view or in-place result of an input: freshly allocated
                    new = True
                    self.live[key] = (weakref.ref(storage, lambda _, k=key: self._freed(k)), nbytes)
                    self.live_bytes += nbytes
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        record = TensorRecord(op, tuple(tensor.shape), tensor.dtype, new)
        if self.keep_all:
            self.records.append(record)
        if self.largest is None or record.numel > self.largest.numel:
            self.largest = record
        if new and (self.largest_new is None or record.nbytes > self.largest_new.nbytes):
            self.largest_new = record

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        inputs = set()
        for value in tree_leaves((args, kwargs)):
            if isinstance(value, torch.Tensor) and not value.is_sparse:
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    inputs.add(id(value.untyped_storage()))
        out = func(*args, **kwargs)
        for value in tree_leaves(out):
            if isinstance(value, torch.Tensor):
                self._note(str(func.overloadpacket.__name__), value, inputs)
        return out


@dataclass
class MemoryTracker:
    """Peak allocated bytes above the entry level, and every tensor ops produced, inside a ``with`` block.

    Args:
        device: ``"cpu"`` (allocator events of the profiler) or ``"cuda"`` (the CUDA allocator's statistics).
        keep_all: keep a :class:`TensorRecord` of every tensor (for tests); otherwise only the largest.

    After the block: ``peak_bytes`` (allocator, all temporaries), ``op_peak_bytes`` (storages returned by ops),
    ``end_bytes`` (still allocated on exit, CPU and CUDA), ``largest`` (the tensor with most elements, views
    included), ``largest_new`` (the largest newly allocated storage) and ``records``.

    Frees of tensors that existed before entry lower the allocator's running sum (so start every compared run from
    the same state, e.g. without gradients). The dispatch mode itself slightly perturbs lifetimes: on a 4-layer,
    256-wide GPT-2 training step the allocator peak read 1 MiB (0.6%) higher with it than with the profiler alone.
    """

    device: str = "cpu"
    keep_all: bool = False
    peak_bytes: int = 0
    op_peak_bytes: int = 0
    end_bytes: int = 0
    largest: Optional[TensorRecord] = None
    largest_new: Optional[TensorRecord] = None
    records: list[TensorRecord] = field(default_factory=list)

    def __enter__(self) -> "MemoryTracker":
        self._ops = _OpTensors(self.keep_all)
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._start = torch.cuda.memory_allocated()
        else:
            self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._profiler.__enter__()
        self._ops.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._ops.__exit__(*exc)
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated() - self._start
            self.end_bytes = torch.cuda.memory_allocated() - self._start
        else:
            self._profiler.__exit__(*exc)
            self.peak_bytes, self.end_bytes = _peak_of_events(self._profiler)
            del self._profiler
        self.op_peak_bytes = self._ops.peak_bytes
        self.largest, self.largest_new, self.records = self._ops.largest, self._ops.largest_new, self._ops.records
        del self._ops


def _peak_of_events(prof: profile) -> tuple[int, int]:
    """Highest and final running sum of the CPU allocator's events (bytes > 0 allocated, < 0 freed), in time order."""
    events = [
        e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.device_type() == DeviceType.CPU
    ]
    events.sort(key=lambda e: e.start_ns())
    running = peak = 0
    for event in events:
        running += event.nbytes()
        peak = max(peak, running)
    return peak, running


# ------------------------------------------------------------------------------------------- documented bounds
FLOAT32, FLOAT64 = 4, 8


def chunk_rows(chunk_size: int, rows: int) -> int:
    """Rows in the largest chunk: ``min(c, N)``."""
    return min(chunk_size, rows)


def training_bound(vocab: int, width: int, layers: int, rows: int, chunk_size: int) -> dict[str, int]:
    """Extra peak bytes of a training step with the chunked head over the backbone's own forward and backward.

    Autograd adds the gradients of a tensor used several times out of place (the running sum, the new gradient and
    their sum are alive together), and the head's weight ``(V, d)`` is used by every chunk of every layer. So in the
    backward pass of a chunk either three float32 ``(c, V)`` tensors (the recomputed log-probabilities, their
    gradient and the gradient of the logits) are alive next to the running ``(V, d)`` weight gradient, or, when a
    chunk's weight gradient is added, three ``(V, d)`` tensors: ``4 · V · max(3c + d, 3d)`` bytes. The gradients of
    the stacked features add at most ``4 · 3(L + 1) · N · d`` bytes (each layer's ``select_backward`` and each
    chunk's ``slice_backward`` are accumulated in the same way).
    """
    c = chunk_rows(chunk_size, rows)
    return {
        "head (chunks, weight grads)": vocab * max(3 * c + width, 3 * width) * FLOAT32,
        "feature grads": 3 * (layers + 1) * rows * width * FLOAT32,
    }


def analysis_bound(vocab: int, width: int, layers: int, rows: int, chunk_size: int) -> dict[str, int]:
    """Extra peak bytes of ``layer_outputs`` (no_grad) over the backbone's forward pass.

    Terms: one chunk's float32 logits, their float64 copy and the float64 ``exp`` buffer inside ``logsumexp``
    (``c × V × (4 + 8 + 8)``); the copy of the kept rows of the features ``(L, N, d)`` float32 and the readout
    ``(L, N)``: a long prediction and two float64 values per row and layer.
    """
    c = chunk_rows(chunk_size, rows)
    return {
        "chunk logits": c * vocab * (FLOAT32 + FLOAT64 + FLOAT64),
        "features copy": layers * rows * width * FLOAT32,
        "readout": layers * rows * 3 * 8,
    }
