"""The quickstart with 1 and 2 intra-op threads, on a quiet machine and beside CPU-bound processes (issue 35.5).

Runs the shipped quickstart (``layerwise fit --config configs/quickstart.yaml --threads T``, cut to ``--epochs``
epochs; its drawing process runs beside it as usual) in a fresh folder for every pair of threads T in (1, 2) and
load in (0, 1, 2 busy processes: a Python loop each, started before and stopped after the fit), and records the
wall time of each whole process (start-up included), side by side in one run. The busy processes are as many as
the 2-core machine has cores at most: "a laptop busy with something else".

    .venv/bin/python benchmarks/threads.py               # 5 epochs (~20 s a run quiet; 6 runs)
    .venv/bin/python benchmarks/threads.py --epochs 40   # the whole quickstart
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _load import busy_processes, fit_seconds  # noqa: E402
from _record import load_now, record  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "quickstart.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    load_before = load_now()
    seconds: dict[str, dict[str, float]] = {}
    for load in (0, 1, 2):
        with busy_processes(load):
            for threads in (1, 2):
                seconds.setdefault(f"busy_{load}", {})[f"threads_{threads}"] = round(
                    fit_seconds(CONFIG, args.epochs, f"--threads={threads}"), 1
                )
                print(
                    f"{load} busy process(es), {threads} thread(s): {seconds[f'busy_{load}'][f'threads_{threads}']} s"
                )
    ratios = {load: round(row["threads_2"] / row["threads_1"], 2) for load, row in seconds.items()}
    record(
        f"threads_{args.epochs}_epochs",
        {"epochs": args.epochs, "seconds": seconds, "two_over_one": ratios},
        load_before,
    )


if __name__ == "__main__":
    main()
