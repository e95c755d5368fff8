"""Two checkouts side by side in one run: `compare_models` against the two plain forwards, and coupling against the
authors' method, each checkout's ratios from its own alternated timings, the checkouts alternated round by round.

A change's "no step slower" check: each round starts one fresh process per checkout (``PYTHONPATH`` set to it, the
order reversed every other round), which imports that checkout's ``layerwise`` and this checkout's benchmark code
(``compare.py``'s models, ``coupling.py``'s methods), so only the library differs. Inside a process the variants
alternate (medians of ``--repeats``); across rounds the table gives the median of each process's ratio and every
round's value, with the 1-minute load average before each process.

- ``compare``: two random GPT-2 base models, ``--batches`` batches of ``--batch`` x ``--tokens`` random ids. ``plain``:
  both forwards over every batch, no hooks; ``all`` and ``diagonal``: ``compare_models`` over every batch
  (``pairs="all"``/``"diagonal"``, exact), and over the first 2. ``whole``: the comparison's time over all the tokens
  against ``plain`` (the once-per-comparison costs included); ``further``: the cost of each further batch,
  (t_n - t_2) / (n - 2), against one batch's plain forwards (``compare.py``'s figure).
- ``coupling``: ``coupling.py``'s ``authors`` and ``layerwise`` methods on one prompt, alternated: seconds per prompt
  for the whole depth-wise matrix (K = 10, 30, 50), authors / layerwise.

    python benchmarks/side_by_side.py compare /path/to/before . --layers 6 --dim 256 --heads 4 --threads 1
    python benchmarks/side_by_side.py coupling /path/to/before . --layers 4 --dim 256 --heads 4 --threads 1
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _compare_worker(args: argparse.Namespace) -> dict:
    import functools

    import torch
    from compare import build, timed

    from layerwise.engines.compare import compare_models

    args.device = "cpu"
    a, b = build(args, 0).base_model, build(args, 1).base_model
    generator = torch.Generator().manual_seed(2)
    batches = [
        {"input_ids": torch.randint(0, 50257, (args.batch, args.tokens), generator=generator)}
        for _ in range(args.batches)
    ]

    def plain() -> None:
        with torch.no_grad():
            for batch in batches:
                a(**batch)
                b(**batch)

    runs = {"plain": plain}
    for pairs in ("all", "diagonal"):
        for count in (2, args.batches):
            runs[f"{pairs}_{count}"] = functools.partial(compare_models, a, b, batches[:count], pairs=pairs)
    for run in runs.values():  # warm-up
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            times[name].append(timed(run, "cpu"))
    median = {name: statistics.median(values) for name, values in times.items()}
    n = args.batches
    values = {"plain_s": median["plain"]}
    for pairs in ("all", "diagonal"):
        values[f"{pairs}_whole"] = median[f"{pairs}_{n}"] / median["plain"]
        values[f"{pairs}_further"] = (median[f"{pairs}_{n}"] - median[f"{pairs}_2"]) / (n - 2) / (median["plain"] / n)
    return values


def _coupling_worker(args: argparse.Namespace) -> dict:
    import torch
    from coupling import METHODS, build, timed

    model = build(args.layers, args.dim, args.heads, "cpu")
    ids = torch.randint(0, 50257, (1, args.tokens), generator=torch.Generator().manual_seed(1))
    names = ("authors", "layerwise")
    for name in names:  # warm-up
        timed(METHODS[name], model, ids, "cpu")
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:
            times[name].append(timed(METHODS[name], model, ids, "cpu")[0])
    authors, ours = statistics.median(times["authors"]), statistics.median(times["layerwise"])
    return {"authors_s": authors, "layerwise_s": ours, "speedup": authors / ours}


def _load() -> float:
    return os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case", choices=("compare", "coupling"))
    parser.add_argument("trees", nargs="+", help="checkouts whose layerwise to time")
    parser.add_argument("--rounds", type=int, default=3, help="processes per checkout, alternated")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each variant per process")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2, help="compare: rows per batch")
    parser.add_argument("--tokens", type=int, default=None, help="per row (compare: 256) or prompt (coupling: 64)")
    parser.add_argument("--batches", type=int, default=8, help="compare: batches per comparison")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.tokens = args.tokens or (256 if args.case == "compare" else 64)
    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        import layerwise

        values = (_compare_worker if args.case == "compare" else _coupling_worker)(args)
        print(json.dumps({"layerwise": layerwise.__file__, **values}))
        return

    trees = [str(Path(tree).resolve()) for tree in args.trees]
    options = ("repeats", "threads", "layers", "dim", "heads", "batch", "tokens", "batches")
    forwarded = [text for name in options for text in (f"--{name}", str(getattr(args, name)))]
    results: dict[str, list[dict]] = {tree: [] for tree in trees}
    start = time.perf_counter()
    for round_ in range(args.rounds):
        for tree in trees if round_ % 2 == 0 else trees[::-1]:
            load = _load()
            command = [sys.executable, str(HERE / "side_by_side.py"), args.case, tree, *forwarded, "--worker"]
            env = {**os.environ, "PYTHONPATH": tree}
            done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tree)
            if done.returncode != 0:
                raise SystemExit(f"{tree}: rc {done.returncode}\n{done.stderr[-3000:]}")
            values = json.loads(done.stdout.strip().splitlines()[-1])
            if not values["layerwise"].startswith(tree):
                raise SystemExit(f"{tree} imported layerwise from {values['layerwise']}")
            results[tree].append({**values, "load": load})
            print(f"round {round_ + 1} {tree}: {json.dumps(values)} load {load:.2f}", flush=True)
    loads = [r["load"] for rounds in results.values() for r in rounds]
    print(
        f"\n{args.case}: {args.rounds} rounds, {args.repeats} repeats each, {args.threads} thread(s), "
        f"{time.perf_counter() - start:.0f} s; load before each process {min(loads):.2f} to {max(loads):.2f}"
    )
    keys = [key for key in results[trees[0]][0] if key not in ("layerwise", "load")]
    for tree in trees:
        print(f"{tree}")
        for key in keys:
            rounds = [r[key] for r in results[tree]]
            print(f"  {key:<18}{statistics.median(rounds):>9.3f}   ({' '.join(f'{v:.3f}' for v in rounds)})")


if __name__ == "__main__":
    main()
