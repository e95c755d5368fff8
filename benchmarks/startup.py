"""How long ``layerwise --help`` and every command's ``--help`` take, each a fresh process (issue 23.14).

The commands are named in a static table in ``layerwise/cli/app.py`` and their modules imported on demand, and those
modules import torch, transformers and Lightning only inside the functions that run, so the top help and the help
of every command but the four LightningCLI ones (fit, validate, test, predict: their parser is built from the
Lightning classes) answer without importing them (Lightning alone takes 8-17 s to import on a loaded 2-core
machine). Their help is kept after its first rendering (``layerwise/cli/help_cache.py``): ``fit_help`` is the first one
(an empty store), ``fit_help_kept`` the next. Each command runs ``--repeats`` times (interleaved, so background load
hits all alike); the median and the largest wall time of each, in seconds, are recorded with the machine and its
load.

    .venv/bin/python benchmarks/startup.py              # 5 runs each: about a minute (the Lightning ones dominate)
    .venv/bin/python benchmarks/startup.py --repeats 9
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import load_now, record  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from layerwise.cli.app import COMMANDS as CLI_COMMANDS  # noqa: E402
from layerwise.cli.app import TRAINER_COMMANDS  # noqa: E402

COMMANDS = {"help": ["--help"], **{f"{name}_help": [name, "--help"] for name in [*CLI_COMMANDS, *TRAINER_COMMANDS]}}
# the LightningCLI commands' help once more, after its first rendering was kept (layerwise/cli/help_cache.py)
COMMANDS.update({f"{name}_help_kept": [name, "--help"] for name in TRAINER_COMMANDS})


def seconds(argv: list[str], cache: str) -> float:
    """Wall time of ``python -m layerwise ARGV`` in a fresh process (it must succeed), help texts kept in ``cache``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env["LAYERWISE_CACHE_DIR"] = cache
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "layerwise", *argv], check=True, capture_output=True, cwd=ROOT, env=env)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", nargs="+", help="time these entries only (e.g. help compare_help fit_help)")
    args = parser.parse_args()
    commands = {name: argv for name, argv in COMMANDS.items() if not args.only or name in args.only}
    load_before = load_now()
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as cache:  # every repeat starts with no kept help: `fit_help` renders it
            for name, argv in commands.items():
                times[name].append(seconds(argv, cache))
    values = {f"{name}_median_s": round(statistics.median(runs), 2) for name, runs in times.items()}
    values.update({f"{name}_max_s": round(max(runs), 2) for name, runs in times.items()})
    values["repeats"] = args.repeats
    for name, argv in commands.items():
        kept = " (kept)" if name.endswith("_kept") else ""
        median, largest = values[f"{name}_median_s"], values[f"{name}_max_s"]
        print(f"layerwise {' '.join(argv)}{kept}: median {median} s, max {largest} s")
    record("startup", values, load_before)


if __name__ == "__main__":
    main()
