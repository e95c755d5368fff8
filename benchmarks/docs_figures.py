"""Draw the pictures in ``docs/figures/`` from runs of the shipped configs, in the current style (issue 52).

Every picture in ``docs/figures/`` is listed in :data:`FIGURES` with the command that draws it; each records the
style's version (``layerwise.figures.style.STYLE_VERSION``) in its PNG text, and ``tests/project/test_docs_figures.py``
fails when one records an older version than the style module's, or when a picture has no command here.

    python benchmarks/docs_figures.py quickstart    # one quickstart fit (configs/quickstart.yaml, 40 epochs):
                                                    #   report.png, quickstart_cos_distribution.png,
                                                    #   quickstart_residual_norm_ratio.png
    python benchmarks/docs_figures.py tensorboard   # tensorboard_val_acc.png: TensorBoard's val/acc/layers card in
                                                    #   Chromium (tests/callbacks/test_tensorboard_chromium.py)
    python benchmarks/docs_figures.py ablation      # ablation_residual.png, ablation_plain.png (benchmarks/demos.py)
    python benchmarks/docs_figures.py transfer      # transfer.png (benchmarks/demos.py)
    python benchmarks/training_modes.py             # training_modes_accuracy.png, training_modes_cos.png
    python benchmarks/tuned_lens_comparison.py      # tuned_lens_accuracy.png, tuned_lens_kl.png (digits)
    python benchmarks/tuned_lens_comparison.py --family shakespeare   # tuned_lens_shakespeare_*.png
    python benchmarks/docs_figures.py --check       # which pictures are older than the style (exit 1 if any)

``--run-dir DIR`` keeps the runs (and reuses a finished quickstart run there); ``--epochs N`` shortens the
quickstart fit (the docs show the shipped 40 epochs).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "figures"
# picture -> the command that draws it (the docs page that shows it says so too)
FIGURES = {
    "report.png": "python benchmarks/docs_figures.py quickstart",
    "quickstart_cos_distribution.png": "python benchmarks/docs_figures.py quickstart",
    "quickstart_residual_norm_ratio.png": "python benchmarks/docs_figures.py quickstart",
    "tensorboard_val_acc.png": "python benchmarks/docs_figures.py tensorboard",
    "ablation_residual.png": "python benchmarks/docs_figures.py ablation",
    "ablation_plain.png": "python benchmarks/docs_figures.py ablation",
    "transfer.png": "python benchmarks/docs_figures.py transfer",
    "training_modes_accuracy.png": "python benchmarks/training_modes.py",
    "training_modes_cos.png": "python benchmarks/training_modes.py",
    "tuned_lens_accuracy.png": "python benchmarks/tuned_lens_comparison.py",
    "tuned_lens_kl.png": "python benchmarks/tuned_lens_comparison.py",
    "tuned_lens_shakespeare_accuracy.png": "python benchmarks/tuned_lens_comparison.py --family shakespeare",
    "tuned_lens_shakespeare_kl.png": "python benchmarks/tuned_lens_comparison.py --family shakespeare",
}
DPI = 200  # the docs' pictures: sharp on a high-density screen, small enough for the repository


def stamp_png(path: Path, title: str = "") -> None:
    """Record the style's version (and a title) in a PNG drawn outside matplotlib (a browser's screenshot)."""
    from PIL import Image, PngImagePlugin

    from layerwise.figures.style import STYLE_VERSION

    image = Image.open(path)
    info = PngImagePlugin.PngInfo()
    info.add_text("Title", title)
    info.add_text("Software", "layerwise")
    info.add_text("layerwise style", str(STYLE_VERSION))
    image.save(path, pnginfo=info)


def style_of(path: Path) -> int:
    """The style version a picture records (0: none)."""
    from PIL import Image

    return int(Image.open(path).info.get("layerwise style", 0))


def quickstart_run(run_dir: Path, epochs: int) -> Path:
    """The quickstart fit as a user runs it (``layerwise fit --config quickstart``), reused when already there."""
    run = run_dir / "quickstart" / "version_0"
    if (run / "checkpoints" / "last.ckpt").exists():
        print(f"reusing {run}", flush=True)
        return run
    command = [sys.executable, "-m", "layerwise", "fit", "--config", str(ROOT / "configs" / "quickstart.yaml")]
    command += [f"--trainer.logger.init_args.save_dir={run_dir}", "--trainer.enable_progress_bar=false"]
    if epochs != 40:
        command += [f"--trainer.max_epochs={epochs}", f"--model.init_args.lr_scheduler.init_args.max_epochs={epochs}"]
    print("running:", " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=run_dir)
    return run


def quickstart(run_dir: Path, epochs: int) -> None:
    """The report and the quickstart's COS distribution and residual norm ratio, at page width."""
    run = quickstart_run(run_dir, epochs)
    out = run_dir / "plot"
    command = [sys.executable, "-m", "layerwise", "plot", str(run), "--out", str(out), "--format", "png"]
    subprocess.run([*command, "--dpi", str(DPI)], check=True)
    for name in ("cos_distribution", "residual_norm_ratio"):
        (drawn,) = sorted(out.glob(f"val_epoch_*_{name}.png"))[-1:]
        shutil.copyfile(drawn, DOCS / f"quickstart_{name}.png")
        print(f"-> docs/figures/quickstart_{name}.png")
    report = run_dir / "report" / "report.html"
    subprocess.run([sys.executable, "-m", "layerwise", "report", str(run), "--out", str(report)], check=True)
    screenshot_report(report, DOCS / "report.png")
    print("-> docs/figures/report.png")


def screenshot_report(report: Path, target: Path) -> None:
    """The top of the report (title, per-layer table, early exit, the heatmaps), the config folded, in Chromium."""
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import CHROMIUM, CHROMIUM_FLAGS

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900}, device_scale_factor=1)
            page.goto(report.as_uri())
            page.wait_for_timeout(500)
            page.evaluate("document.querySelectorAll('details').forEach((d) => { d.open = false; })")  # the config
            height = min(1800, page.evaluate("document.body.scrollHeight"))
            page.screenshot(path=str(target), full_page=True, clip={"x": 0, "y": 0, "width": 1300, "height": height})
        finally:
            browser.close()
    stamp_png(target, "layerwise report of the quickstart run")


def tensorboard() -> None:
    """TensorBoard's val/acc/layers card of a 5-epoch quickstart, photographed by the Chromium test."""
    target = DOCS / "tensorboard_val_acc.png"
    env = {**os.environ, "LAYERWISE_TENSORBOARD_SCREENSHOT": str(target)}
    test = ROOT / "tests" / "callbacks" / "test_tensorboard_chromium.py"
    subprocess.run(
        [sys.executable, "-m", "pytest", str(test), "-q", "-m", "slow", "-p", "no:cacheprovider"], check=True, env=env
    )
    stamp_png(target, "TensorBoard: val/acc/layers of the quickstart, a line per layer")
    print("-> docs/figures/tensorboard_val_acc.png")


def demo(name: str, run_dir: Path) -> None:
    """``benchmarks/demos.py ablation`` or ``transfer``, its figures copied into the docs."""
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "demos.py"), name, "--out", str(run_dir)], check=True)
    names = ("ablation_residual.png", "ablation_plain.png") if name == "ablation" else ("transfer.png",)
    for picture in names:
        shutil.copyfile(run_dir / picture, DOCS / picture)
        print(f"-> docs/figures/{picture}")


def check() -> int:
    """Print each picture's style version against the style module's; 1 if any is older or has no command."""
    from layerwise.figures.style import STYLE_VERSION

    stale = 0
    for path in sorted(DOCS.glob("*.png")):
        version = style_of(path)
        command = FIGURES.get(path.name, "(no command)")
        fresh = version == STYLE_VERSION and path.name in FIGURES
        stale += not fresh
        print(f"{'ok   ' if fresh else 'STALE'} {path.name}: style {version} (now {STYLE_VERSION}) <- {command}")
    return 1 if stale else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", choices=["quickstart", "tensorboard", "ablation", "transfer"])
    parser.add_argument("--run-dir", type=Path, help="where the runs go, kept (default: a temporary folder)")
    parser.add_argument("--epochs", type=int, default=40, help="quickstart epochs (the docs show the shipped 40)")
    parser.add_argument("--check", action="store_true", help="list the pictures older than the style")
    args = parser.parse_args()
    if args.check or args.what is None:
        return check()
    run_dir = (args.run_dir or Path(tempfile.mkdtemp(prefix="layerwise_docs_figures_"))).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.what == "quickstart":
        quickstart(run_dir, args.epochs)
    elif args.what == "tensorboard":
        tensorboard()
    else:
        demo(args.what, run_dir)
    return check()


if __name__ == "__main__":
    sys.exit(main())
