"""The drawing process's cost: its start-up (until its first job's figures are back) and its peak memory (issue 36.3).

Starts the worker as a training process does (``python -c "from layerwise.figures.worker import serve; serve()"``),
hands it the job a quickstart validation hands it (the figures of a summary written by ``LayerwiseAnalysis`` and
``ResidualNormRatioMonitor`` on the 6-layer quickstart ViT) and measures the seconds until the rendered images are
back and the process's peak resident memory (``VmHWM``). For comparison, in the same run: what importing
``layerwise.callbacks`` costs a fresh interpreter (what the worker imported before it moved to ``figures/``).

    .venv/bin/python benchmarks/drawing_worker.py            # 3 repeats, medians recorded
"""

import json
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import load_now, record  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SUMMARY = Path(__file__).resolve().parent / "data" / "quickstart_summary.json"  # a quickstart validation's summary


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker_run(summary: dict) -> tuple[float, float, int]:
    """Seconds from start to the first job's images, peak RSS in MB, and how many images came back."""
    from layerwise.figures.summary import evaluation_figures
    from layerwise.figures.worker import FigureJob, read_frame, write_frame

    job = pickle.dumps(FigureJob(evaluation_figures, ("val", summary)), protocol=pickle.HIGHEST_PROTOCOL)
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-c", "from layerwise.figures.worker import serve; serve()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={"MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "PATH": "", "PYTHONPATH": str(REPO)},
    )
    write_frame(process.stdin, job)
    images = pickle.loads(read_frame(process.stdout))
    seconds = time.perf_counter() - start
    rss = peak_rss_mb(process.pid)
    process.stdin.close()
    process.wait(timeout=30)
    return seconds, rss, len(images)


def import_run(module: str) -> tuple[float, float]:
    """Seconds and peak RSS (MB) of a fresh interpreter that imports ``module``."""
    code = f"import {module}, resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return time.perf_counter() - start, float(result.stdout.strip())


def main() -> None:
    summary = json.loads(SUMMARY.read_text())
    load_before = load_now()
    runs = [worker_run(summary) for _ in range(3)]
    before = [import_run("layerwise.callbacks") for _ in range(3)]
    values = {
        "worker_first_job_s": round(statistics.median(r[0] for r in runs), 2),
        "worker_peak_rss_mb": round(statistics.median(r[1] for r in runs), 1),
        "images_per_job": runs[0][2],
        "callbacks_import_s": round(statistics.median(b[0] for b in before), 2),
        "callbacks_import_rss_mb": round(statistics.median(b[1] for b in before), 1),
    }
    print(json.dumps(values, indent=1))
    record("drawing_worker", values, load_before)


if __name__ == "__main__":
    main()
