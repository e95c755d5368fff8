"""What a process of a distributed command says when another one died or hangs: one line naming the rank.

When one process of a DDP/FSDP run dies (``kill -9``, the OOM killer, an exception on that rank only), the others
find out at their next collective. With gloo on CPUs that is at once: the dead peer's sockets are closed, and the
collective raises ``RuntimeError: [.../gloo/transport/tcp/pair.cc] Read error ...: Connection reset by peer``
(measured: ``benchmarks/dead_rank.py``); under Lightning's ``ddp`` launcher, its observer thread would also kill
everything within 5 s of a child's exit. A peer that hangs without dying is found only when the collective gives
up, after the process group timeout (gloo: ``RuntimeError: Application timeout caused pair closure``):
Lightning's ``DDPStrategy(timeout=...)``/``ModelParallelStrategy(timeout=...)``, default 30 minutes
(``--trainer.strategy=DDPStrategy --trainer.strategy.init_args.timeout=0:05:00``). Either way the collective's
error says nothing a user can act on. :func:`lost_peer_line` turns it into one line: which rank died and how
(a rank that raised leaves its error in the process group's store first; one killed is found by global rank zero
under Lightning's ``ddp`` launcher, which started the others and can ask them), or that a peer ended or hung; a
hung process this one started is killed (:func:`end_children`), so nothing outlives the bound.
"""

import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from layerwise._compat import default_store, process_group_timeout
from layerwise.cli.errors import failed_writes_in_one_line
from layerwise.errors import DEBUG_VARIABLE

_LOST_PEER = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "Connection refused",
    "DistNetworkError",
    "NCCL communicator was aborted",
)
_TIMED_OUT = ("Application timeout caused pair closure", "Timed out waiting", "timed out")


@contextmanager
def machine_failures_in_one_line(command: str, cli: Any) -> Iterator[None]:
    """Around a trainer command's run: what the machine did wrong, in one line and exit code 1.

    A file that could not be written (a full disk: :func:`~layerwise.cli.errors.failed_writes_in_one_line`); a
    collective that lost a peer (:func:`lost_peer_line`, exiting at once). Any other failure of this rank is left in
    the store for rank zero's line (:func:`record_failure`) and goes on. The traceback with ``LAYERWISE_DEBUG=1``.
    """
    try:
        with failed_writes_in_one_line(f"layerwise {command}"):
            yield
    except Exception as error:
        trainer = getattr(cli, "trainer", None)
        if trainer is not None and is_lost_peer(error) and not os.environ.get(DEBUG_VARIABLE):
            sys.stderr.write(lost_peer_line(command, trainer, error) + "\n")
            end_children(trainer)
            exit_now(1)
        record_failure(trainer, error)
        raise


def is_lost_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective that lost a peer process (it died) or gave up waiting on it (timeout)."""
    names = {cls.__name__ for cls in type(error).__mro__}
    message = str(error)
    collective = bool({"DistError", "DistBackendError", "DistNetworkError"} & names)
    collective = collective or "gloo" in message or "pair closure" in message  # gloo raises a plain RuntimeError
    return collective and any(text in message for text in _LOST_PEER + _TIMED_OUT)


def _failure_key(rank: int) -> str:
    return f"layerwise/failed/{rank}"


def record_failure(trainer: Any, error: BaseException) -> None:
    """Leave this rank's failure in the process group's store, for rank zero's line (every rank but zero)."""
    if trainer is None or trainer.world_size < 2 or trainer.global_rank == 0:
        return
    store = default_store()
    if store is None:
        return
    try:
        store.set(_failure_key(trainer.global_rank), f"{type(error).__name__}: {error}".splitlines()[0][:200])
    except Exception:  # the store's host is gone too: nothing to tell
        pass


def recorded_failures(trainer: Any) -> list[tuple[int, str]]:
    """``(global rank, its error)`` of the ranks that left their failure in the store (:func:`record_failure`)."""
    store = default_store()
    if store is None:
        return []
    failures = []
    for rank in range(1, trainer.world_size):
        try:
            if store.check([_failure_key(rank)]):
                failures.append((rank, store.get(_failure_key(rank)).decode("utf-8", "replace")))
        except Exception:
            return failures
    return failures


def ended_children(trainer: Any) -> list[tuple[int, int]]:
    """``(global rank, return code)`` of the processes this one launched that have ended with an error.

    Only global rank zero under Lightning's ``ddp`` launcher started the others (``launcher.procs``, local ranks 1..n
    of this node).
    """
    launcher = getattr(trainer.strategy, "launcher", None)
    procs = list(getattr(launcher, "procs", None) or [])
    first = trainer.node_rank * trainer.num_devices
    return [(first + i + 1, code) for i, proc in enumerate(procs) if (code := proc.poll())]


def who_ended(trainer: Any, wait_s: float = 4.0) -> tuple[list[tuple[int, str]], list[tuple[int, int]]]:
    """The ranks that recorded their failure, and the launched ones that ended, waiting up to ``wait_s`` for either.

    A peer's sockets close a moment before its exit is visible (or before a raising rank's store write lands).
    """
    deadline = time.monotonic() + wait_s
    while True:
        raised, ended = recorded_failures(trainer), ended_children(trainer)
        if raised or ended or time.monotonic() > deadline:
            return raised, ended
        time.sleep(0.05)


def end_children(trainer: Any) -> None:
    """Kill the processes this one launched that still run (a hung rank): nothing outlives the command's end."""
    launcher = getattr(trainer.strategy, "launcher", None)
    for proc in list(getattr(launcher, "procs", None) or []):
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def exit_now(code: int) -> NoReturn:
    """Exit at once with ``code``, the output flushed: no clean-up that could wait on the lost peer.

    Lightning has finalised the loggers already; the process group's own clean-up could block on the dead peer, and
    Lightning's ``ddp`` launcher kills this process (SIGKILL) a few seconds after a child's exit anyway.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def how_it_ended(code: int) -> str:
    """``killed by signal 9 (SIGKILL)`` or ``exited with code 1``."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        return f"killed by signal {-code} ({name})"
    return f"exited with code {code}"


def lost_peer_line(command: str, trainer: Any, error: BaseException) -> str:
    """The one line a process says when its collective lost a peer: the rank that died, or that one ended or hung."""
    where = f"at epoch {trainer.current_epoch}, step {trainer.global_step}"
    timeout = process_group_timeout(trainer.strategy)
    option = f"--trainer.strategy.init_args.timeout={timeout}" if timeout else "--trainer.strategy.init_args.timeout"
    raised, failed = who_ended(trainer)
    if raised:
        ranks = "; ".join(f"rank {rank} failed ({message})" for rank, message in raised)
        cause = f"{ranks} {where}; the run stopped"
    elif failed:
        ranks = "; ".join(f"rank {rank} {how_it_ended(code)}" for rank, code in failed)
        cause = f"{ranks} {where}; the run stopped"
    elif any(text in str(error) for text in _TIMED_OUT) and not any(text in str(error) for text in _LOST_PEER):
        cause = f"a collective waited past the process group timeout ({option}) {where}: another rank hangs"
    else:
        cause = f"another rank ended {where} (its own output says which and why); the run stopped"
    return f"layerwise {command}: error: {cause}. {last_checkpoint(trainer)}"


def last_checkpoint(trainer: Any) -> str:
    """Where the run can resume from: its last complete checkpoint, if it saved one."""
    paths = {
        path
        for callback in trainer.checkpoint_callbacks
        for path in (getattr(callback, "last_model_path", ""), getattr(callback, "best_model_path", ""))
        if path and Path(path).exists()
    }
    if not paths:
        return "No checkpoint was saved yet."
    latest = max(paths, key=lambda path: Path(path).stat().st_mtime)
    return f"The last complete checkpoint: {latest} (resume with --ckpt_path)."
