"""Tuned-lens training throughput: layerwise's ``TunedLens`` fit against the ``tuned-lens`` package's own loop.

The same model (the Tiny Shakespeare demo's GPT-2 shape: 4 blocks, width 128, byte tokens, random weights: the
throughput does not depend on them), the same data (Tiny Shakespeare in 64-token sequences, 32 per step: 2,048 tokens
per optimizer step), the same objective (KL to the final layer summed over the layers) and optimizer (SGD, Nesterov),
one process on the CPU, in one run:

- layerwise: ``TunedLens`` under a Lightning ``Trainer`` (float32), as ``layerwise fit --config tuned_lens/...`` does;
- tuned-lens: ``tuned_lens.scripts.train_loop.Train(...).execute()`` (its per-layer backward under bf16 autocast,
  its ``DataLoader2``), run by ``--tuned-lens-python`` (an interpreter where the package imports: it pins
  ``torchdata``'s ``DataLoader2`` and ``simple_parsing``, which the project does not install). Only its model
  loading is replaced (tuned-lens 0.2.0 passes ``load_in_8bit`` to ``from_pretrained``, which transformers 5 refuses);
  the loop itself runs as shipped.

Each side runs ``--steps`` and ``2 * --steps`` optimizer steps; tokens/s = ``steps * 2048 / (t(2 steps) - t(steps))``,
so what a run spends once (the first step, Lightning's set-up) cancels out; tuned-lens's clock starts after its
``setup`` (model loading and tokenisation, which the ``datasets`` cache makes shorter the second time). Recorded in
``benchmarks/recorded/tuned_lens_throughput.json``.

    python benchmarks/tuned_lens_throughput.py --tuned-lens-python /work/venvs/lens51/bin/python

Exit status 0; without a ``--tuned-lens-python`` that imports the package, only layerwise is measured and the record
says why.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import load_now, record  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TEXT = next(  # beside the checkout (../shared/data), or the VM's /work/shared for a worktree
    (
        root / "tinyshakespeare" / "input.txt"
        for root in (REPO.parent / "shared" / "data", Path("/work/shared/data"))
        if (root / "tinyshakespeare" / "input.txt").is_file()
    ),
    REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt",
)
BLOCK, BATCH = 64, 32
OVERRIDES = dict(n_layer=4, n_embd=128, n_head=4, n_positions=BLOCK, vocab_size=257, bos_token_id=256)
OVERRIDES.update(eos_token_id=256, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)

THEIRS = r"""
import sys, time
from pathlib import Path
from tuned_lens.scripts import ingredients as ing
from tuned_lens.scripts.train_loop import Train
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, data, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])


def load(self, device, must_use_cache=False):  # tuned-lens 0.2.0 passes load_in_8bit, which transformers 5 refuses
    model = AutoModelForCausalLM.from_pretrained(folder).to(device).eval().requires_grad_(False)
    return model, AutoTokenizer.from_pretrained(folder)


ing.Model.load = load
train = Train(
    model=ing.Model(name=folder, precision="float32"),
    data=ing.Data(name=[data], max_length=%(block)d),
    opt=ing.Optimizer(),
    dist=ing.Distributed(per_gpu_batch_size=%(batch)d),
    output=out,
    num_steps=steps,
    tokens_per_step=%(block)d * %(batch)d,
)
setup, started = Train.setup, []


def timed_setup(self):  # the clock starts when the loop does: loading and tokenising (cached or not) left out
    result = setup(self)
    started.append(time.perf_counter())
    return result


Train.setup = timed_setup
train.execute()
print("SECONDS", time.perf_counter() - started[0])
""".replace("%(block)d", str(BLOCK)).replace("%(batch)d", str(BATCH))


def prepare(folder: Path) -> tuple[Path, Path]:
    """The model (saved with its byte tokenizer) and the text as JSON lines of about one sequence each."""
    import torch

    from layerwise.datamodules.tokenizers import byte_tokenizer
    from layerwise.features import HFCausalLM

    torch.manual_seed(0)
    backbone = HFCausalLM(model_type="gpt2", config_overrides=OVERRIDES)
    backbone.model.save_pretrained(folder / "model")
    byte_tokenizer().save_pretrained(folder / "model")
    text = TEXT.read_text()
    data = folder / "shakespeare.jsonl"
    with data.open("w") as file:
        for start in range(0, len(text), 4 * BLOCK):
            file.write(json.dumps({"text": text[start : start + 4 * BLOCK]}) + "\n")
    return folder / "model", data


def ours(model: Path, steps: int) -> float:
    """Seconds of a layerwise TunedLens fit of ``steps`` optimizer steps (model built before the clock starts)."""
    import lightning.pytorch as pl

    from layerwise.datamodules import TextDataModule
    from layerwise.features import HFCausalLM
    from layerwise.lightning_modules import TunedLens

    lens = TunedLens(backbone=HFCausalLM(str(model)))
    data = TextDataModule(train_files=[str(TEXT)], tokenizer="byte", block_size=BLOCK, batch_size=BATCH)
    data.setup("fit")
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        gradient_clip_val=1.0,
    )
    start = time.perf_counter()
    trainer.fit(lens, data)
    return time.perf_counter() - start


def theirs(python: str, model: Path, data: Path, steps: int, out: Path) -> float:
    """Seconds of ``Train.execute()`` of the tuned-lens package for ``steps`` steps, in ``python``."""
    result = subprocess.run(
        [python, "-c", THEIRS, str(model), str(data), str(steps), str(out)], capture_output=True, text=True
    )
    for line in result.stdout.splitlines():
        if line.startswith("SECONDS"):
            return float(line.split()[1])
    raise RuntimeError(f"tuned-lens's loop failed:\n{result.stderr[-3000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps of the short runs (the long: twice)")
    parser.add_argument("--tuned-lens-python", help="a Python that imports tuned_lens (default: this one)")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    python = args.tuned_lens_python or sys.executable
    load_before = load_now()
    tokens = args.steps * BLOCK * BATCH
    values: dict = {"tokens_per_step": BLOCK * BATCH, "steps": [args.steps, 2 * args.steps], "model": OVERRIDES}
    with tempfile.TemporaryDirectory() as folder:
        model, data = prepare(Path(folder))
        short, long = ours(model, args.steps), ours(model, 2 * args.steps)
        values["layerwise_tokens_per_s"] = round(tokens / (long - short), 1)
        check = subprocess.run([python, "-c", "import tuned_lens.scripts.train_loop"], capture_output=True, text=True)
        if check.returncode != 0:
            values["tuned_lens_tokens_per_s"] = None
            values["tuned_lens_missing"] = check.stderr.strip().splitlines()[-1]
        else:
            short = theirs(python, model, data, args.steps, Path(folder) / "a")
            long = theirs(python, model, data, 2 * args.steps, Path(folder) / "b")
            values["tuned_lens_tokens_per_s"] = round(tokens / (long - short), 1)
    if values["tuned_lens_tokens_per_s"]:
        values["layerwise_over_tuned_lens"] = round(
            values["layerwise_tokens_per_s"] / values["tuned_lens_tokens_per_s"], 2
        )
    print(json.dumps(values, indent=1))
    if not args.no_record:
        record("tuned_lens_throughput", values, load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
