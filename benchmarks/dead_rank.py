"""How long the other rank of a 2-process DDP fit takes to end when one rank dies mid-epoch: gloo on CPUs.

The shipped quickstart cut small (a 2-block, 16-wide ViT, 4 training batches per epoch) under Lightning's ``ddp``
launcher on 2 CPU processes, as ``tests/runs/test_dead_rank.py`` runs it: rank 1 dies after its second training
batch of the second epoch (``tests/runs/dying.py``) by ``kill`` (SIGKILL of itself, as ``kill -9`` or the OOM killer),
``raise`` (an exception on rank 1 only) or ``stop`` (SIGSTOP: alive but silent, a hung rank), and rank 0 must end
with its one line naming rank 1. Rank 1 prints the moment it dies (Unix time); this script timestamps rank 0's
error line as it arrives on stderr and the command's exit:

- ``detect s``: from rank 1's death to rank 0's line (the collective's error, then asking who ended);
- ``exit s``: from rank 1's death to the command's exit.

Medians over the repeats. ``stop`` waits for the process group timeout (``--timeout``, h:m:s) by design: its
``detect s`` is the timeout plus the detection.

    python benchmarks/dead_rank.py                          # kill and raise, 3 repeats each; ~6 min on 2 cores
    python benchmarks/dead_rank.py --cases stop --timeout 0:00:30 --repeats 1
"""

import argparse
import os
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runs"))
from _record import load_now, record  # noqa: E402
from dying import DIES, dying_fit  # noqa: E402  (the fit tests/runs/test_dead_rank.py runs)

REPO = Path(__file__).resolve().parents[1]


def once(how: str, timeout: str) -> dict:
    """One fit whose rank 1 dies ``how``: the detection and exit times, rank 0's line and return code."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "LOCAL_RANK", "WORLD_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "runs"), str(REPO), env.get("PYTHONPATH", "")])
    command = dying_fit(how, timeout)
    with tempfile.TemporaryDirectory() as cwd:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue[tuple[str, float, str]] = queue.Queue()

        def read(name: str, stream) -> None:
            for line in stream:
                lines.put((name, time.time(), line.rstrip("\n")))

        streams = (("out", process.stdout), ("err", process.stderr))
        readers = [threading.Thread(target=read, args=stream) for stream in streams]
        for reader in readers:
            reader.start()
        code = process.wait(timeout=1800)
        ended = time.time()
        for reader in readers:
            reader.join()
    died, said, line = None, None, ""
    while not lines.empty():
        stream, when, text = lines.get()
        match = re.match(DIES, text)
        if match:
            died = float(match.group(2))
        if stream == "err" and text.startswith("layerwise fit: error:"):
            said, line = when, text
    if died is None or said is None:
        raise SystemExit(f"{how}: rank 1 did not die, or rank 0 said nothing (rc {code})")
    return {"detect_s": round(said - died, 3), "exit_s": round(ended - died, 3), "returncode": code, "line": line}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=["kill", "raise"], choices=["kill", "raise", "stop"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", default="0:05:00", help="the process group timeout, h:m:s")
    args = parser.parse_args()
    load_before = load_now()
    values: dict = {"timeout": args.timeout}
    for how in args.cases:
        runs = [once(how, args.timeout) for _ in range(args.repeats)]
        for run in runs:
            print(f"{how}: detect {run['detect_s']:.2f} s, exit {run['exit_s']:.2f} s, rc {run['returncode']}")
        values[how] = {
            "detect_s_median": round(statistics.median(r["detect_s"] for r in runs), 3),
            "exit_s_median": round(statistics.median(r["exit_s"] for r in runs), 3),
            "detect_s": [r["detect_s"] for r in runs],
            "exit_s": [r["exit_s"] for r in runs],
            "returncodes": [r["returncode"] for r in runs],
            "line": runs[-1]["line"],
        }
    print(f"rank 0's line: {values[args.cases[0]]['line']}")
    record("dead_rank" + ("" if args.cases == ["kill", "raise"] else "_" + "_".join(args.cases)), values, load_before)


if __name__ == "__main__":
    main()
