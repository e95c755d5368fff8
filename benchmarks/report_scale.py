"""How big `layerwise report` gets for a long run, how long it takes to write, to open and to move its slider.

A synthetic run with the keys a `LayerwiseAnalysis` fit writes (random values, the real shapes: L x L matrices,
L x L x 9 quantiles, L x 400 histogram, 3 early-exit thresholds) for --epochs validations of --stages stages, then
`layerwise report` on it, then headless Chromium (playwright) opens the file and presses the slider's left arrow
--moves times. Prints the sizes and times; nothing is asserted (the tests never time anything).

    python benchmarks/report_scale.py                        # 12 layers, 200 epochs, 2 stages
    python benchmarks/report_scale.py --layers 6 --epochs 40 --stages 1
"""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from layerwise.figures.report import write_report
from layerwise.results import merge_summary, summary_path


def synthetic_run(root: Path, layers: int, epochs: int, stages: int) -> Path:
    rng = np.random.default_rng(0)
    run = root / "run" / "version_0"
    names = ["val", "val_shift", "val_other"][:stages]
    for epoch in range(epochs):
        step = 100 * (epoch + 1)
        for stage in names:
            summary = {
                "stage": stage,
                "epoch": epoch,
                "global_step": step,
                "num_samples": 10000,
                "depth": layers,
                "layers": list(range(1, layers + 1)),
                "cos": rng.uniform(0, 1, (layers, layers)),
                "cka": rng.uniform(0, 1, (layers, layers)),
                "accuracy": np.sort(rng.uniform(0, 1, layers)),
                "loss": rng.uniform(0, 3, layers),
                "nc1": rng.uniform(0, 5, layers),
                "saturation_counts": rng.integers(0, 100, layers),
                "saturation_cos": rng.uniform(0, 1, layers),
                "cos_quantile_levels": [0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0],
                "cos_quantiles": np.sort(rng.uniform(-1, 1, (layers, layers, 9)), axis=-1),
                "cos_negative_fraction": rng.uniform(0, 1, (layers, layers)),
                "cos_histogram_to_last": rng.integers(0, 50, (layers, 400)),
                "early_exit": [
                    {"threshold": t, "accuracy": 0.9, "exit_counts": rng.integers(0, 100, layers), "speedup": 1.3}
                    for t in (0.5, 0.9, 0.99)
                ],
                "effective_depth": {"0.01": layers, "0.05": layers - 1},
                "n_nonfinite": 0,
            }
            merge_summary(summary_path(str(run), stage, epoch, step), summary, "synthetic")
    return run


BROWSER = """
import sys, tempfile, time
from playwright.sync_api import sync_playwright
path, moves = sys.argv[1], int(sys.argv[2])
with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
    context = p.chromium.launch_persistent_context(profile, executable_path="/usr/bin/chromium", headless=True,
                                                   args=["--no-sandbox", "--disable-gpu"])
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    start = time.perf_counter()
    page.goto("file://" + path)
    opened = time.perf_counter() - start
    page.focus("#step")
    start = time.perf_counter()
    for _ in range(moves):
        page.keyboard.press("ArrowLeft")
    page.inner_text("#steplabel")
    moved = (time.perf_counter() - start) / moves
    context.close()
print(f"{opened:.2f} {1000 * moved:.0f} {len(errors)}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--stages", type=int, default=2, choices=(1, 2, 3))
    parser.add_argument("--moves", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        run = synthetic_run(Path(folder), args.layers, args.epochs, args.stages)
        on_disk = sum(p.stat().st_size for p in (run / "layerwise").iterdir())
        start = time.perf_counter()
        out, _ = write_report(run)
        written = time.perf_counter() - start
        print(f"{args.epochs} validations x {args.stages} stages, {args.layers} layers")
        print(f"summaries on disk {on_disk / 1e6:.1f} MB; report {out.stat().st_size / 1e6:.1f} MB in {written:.1f} s")
        if Path("/usr/bin/chromium").exists():
            result = subprocess.run(
                [sys.executable, "-c", BROWSER, str(out), str(args.moves)], capture_output=True, text=True, check=True
            )
            opened, per_move, errors = result.stdout.split()
            print(f"headless Chromium: opened in {opened} s, {per_move} ms per slider move, {errors} page errors")
        else:
            print("headless Chromium: /usr/bin/chromium absent, not measured")


if __name__ == "__main__":
    main()
