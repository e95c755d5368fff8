"""A stitching sweep over a grid of layer pairs (``layerwise stitch``): one ``Stitched`` fit and validation each."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, Optional

from layerwise.commands._lazy import ANNOTATIONS_ONLY
from layerwise.commands._options import TextSource, check_block_size, check_same_vocab, load_model_as, model_tokenizer
from layerwise.errors import lightning_lines_silenced

if ANNOTATIONS_ONLY:
    from torch import nn


def parse_pairs(layers: Optional[Sequence[int]], pairs: Optional[Sequence[str]], depth_a: int, depth_b: int) -> list:
    """The (l, m) pairs: ``pairs`` as "l:m" strings, else (l, l) for ``layers`` (default 1..min(L_A, L_B) - 1)."""
    if pairs:
        out = []
        for text in pairs:
            left, sep, right = str(text).partition(":")
            if not sep or not left.strip().isdigit() or not right.strip().isdigit():
                raise ValueError(f"`--pairs` holds {text!r}: write each pair as l:m, e.g. 2:3.")
            out.append((int(left), int(right)))
    else:
        out = [(layer, layer) for layer in (layers or range(1, min(depth_a, depth_b)))]
    for l_a, m_b in out:
        if not 0 <= l_a <= depth_a or not 0 <= m_b < depth_b:
            raise ValueError(
                f"`--pairs`/`--layers`: ({l_a}, {m_b}) needs 0 <= l <= {depth_a} (A's blocks) and 0 <= m < {depth_b}."
            )
    return out


def hold_in_tail(loader: Any, blocks: int) -> tuple[Any, Optional[Any]]:
    """The training loader split into (fit, dev): dev is the last ``blocks`` items of its dataset, at most a tenth.

    The dev slice chooses phi's step (``Stitched(keep_best=True)``); it is training data, so the held-out data the
    penalties are reported on stays unseen. ``blocks`` 0 (or a dataset under 10 items): no dev slice.
    """
    from torch.utils.data import DataLoader, Subset

    size = len(loader.dataset)
    held = min(blocks, size // 10)
    if held < 1:
        return loader, None

    def part(indices: range, shuffle: bool) -> DataLoader:
        return DataLoader(
            Subset(loader.dataset, list(indices)),
            batch_size=loader.batch_size,
            shuffle=shuffle,
            collate_fn=loader.collate_fn,
            num_workers=loader.num_workers,
            pin_memory=loader.pin_memory,
        )

    return part(range(size - held), True), part(range(size - held, size), False)


def dev_slice_line(asked: int, dev_loader: Any, training: int, steps: int) -> str:
    """What ``layerwise stitch`` says before the sweep about the dev slice that chooses phi's step."""
    if dev_loader is None:
        why = "--dev_blocks 0" if asked == 0 else f"{training} training items: a tenth is under 1"
        return f"layerwise stitch: no dev slice ({why}): phi of the last step."
    held = len(dev_loader.dataset)
    capped = f" (--dev_blocks {asked} capped at a tenth)" if held < asked else ""
    checks = min(20, steps)
    return (
        f"layerwise stitch: the last {held} of {training} training items are a dev slice{capped}, kept out of "
        f"training; phi ends at the lowest dev loss among its start and {checks} checks."
    )


def stitch_sweep(
    model_a: nn.Module,
    model_b: nn.Module,
    pairs: Sequence[tuple[int, int]],
    train_loader: Any,
    val_loader: Any,
    module_options: dict[str, Any],
    trainer_options: dict[str, Any],
    report: Any = print,
    extra: Optional[Mapping[str, Any]] = None,
    seed: Optional[int] = None,
    dev_loader: Any = None,
) -> list[dict[str, Any]]:
    """Fit and validate one stitched model per pair; one row of held-out losses and penalties per pair.

    ``extra``: more evaluation datamodules by name (e.g. ``{"hans": HANSDataModule(...)}``), each validated after
    the main held-out data, its values in the row as ``<name>_<key>`` (its ``label_groups`` applied). ``seed``:
    every pair starts from this seed (phi's initialisation, the order of the training data), so a pair's penalty
    does not depend on the run or on the pairs before it. ``dev_loader``: a dev slice of the training data
    (:func:`hold_in_tail`); phi ends at the step (of 20 checks, its start included) with the lowest stitched loss on
    it, recorded in the row as ``best_step``; without one, at the last step.
    """
    import lightning.pytorch as pl

    from layerwise.lightning_modules.stitched import Stitched

    rows = []
    # Lightning's lines each pair would repeat: each pair's own line says where its phi comes from (not "fit stopped:
    # max_steps reached"), and a run of under 40 steps checks the dev slice after every step, as asked
    with lightning_lines_silenced("`Trainer.fit` stopped", "`Trainer(val_check_interval=1)`"):
        for l_a, m_b in pairs:
            if seed is not None:
                pl.seed_everything(seed, workers=True, verbose=False)
            module = Stitched(model_a, model_b, l_a, m_b, keep_best=dev_loader is not None, **module_options)
            if module.phi.linear is not None and dev_loader is not None:
                steps = trainer_options["max_steps"]
                options = {"val_check_interval": max(1, steps // 20), "check_val_every_n_epoch": None}
                trainer = pl.Trainer(**{**trainer_options, **options, "num_sanity_val_steps": -1})  # -1: the start too
            else:
                trainer = pl.Trainer(**trainer_options)
            if module.phi.linear is not None:
                if train_loader is None:
                    raise ValueError(
                        "A learned phi needs training data: give the training split (or use --phi identity)."
                    )
                module.initialise_phi(train_loader)  # before fit, so that the sanity check measures the start
                with warnings.catch_warnings():
                    # without a dev slice, validation runs after fit: not a missing loader; A and B are frozen in eval
                    # mode on purpose
                    warnings.filterwarnings("ignore", message=".*but have no `val_dataloader`")
                    warnings.filterwarnings("ignore", message=r".*module\(s\) in eval mode at the start of training")
                    trainer.fit(module, train_loader, dev_loader)
            values = trainer.validate(module, val_loader, verbose=False)[0]
            row = {"layer_a": l_a, "layer_b": m_b, **{key.split("/", 1)[1]: float(v) for key, v in values.items()}}
            learned = module.phi.linear is not None
            row["best_step"] = (module.best_step if module.keep_best else trainer.global_step) if learned else None
            for name, datamodule in (extra or {}).items():
                values = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
                row.update({f"{name}_{key.split('/', 1)[1]}": float(v) for key, v in values.items()})
            rows.append(row)
            line = f"l={l_a} m={m_b}: penalty vs B {row['penalty_b']:+.4f} nats, vs A {row['penalty_a']:+.4f}"
            if module.keep_best and row["best_step"] is not None:
                line += f" (phi of step {row['best_step']}, the lowest dev loss)"
            if "acc_drop_b" in row:
                line += (
                    f"; accuracy drop vs B {100 * row['acc_drop_b']:+.2f} points, vs A {100 * row['acc_drop_a']:+.2f}"
                )
            report(line)
    return rows


def stitch_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The penalty table, one row per (l, m): losses and penalties, then accuracies for classifiers."""
    keys = [key for key in rows[0] if key not in ("layer_a", "layer_b")]
    lines = ["| l (A) | m (B) | " + " | ".join(keys) + " |", "|" + "---|" * (2 + len(keys))]
    for row in rows:
        cells = [f"{v:.4f}" if isinstance(v, float) else "-" if v is None else str(v) for v in map(row.get, keys)]
        lines.append(f"| {row['layer_a']} | {row['layer_b']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


STITCH_FILES = ("stitch.json", "stitch.md", "stitch.png")  # what `stitch` writes into --out


def write_stitch(rows: Sequence[dict[str, Any]], record: dict[str, Any], out: Path) -> list[Path]:
    """``stitch.json``, ``stitch.md`` and ``stitch.png`` (the penalty against B per pair) in ``out``."""
    from layerwise.figures.stitch import stitch_figure
    from layerwise.figures.style import plt
    from layerwise.results import save_figure_atomic, write_text_atomic

    json_name, markdown_name, figure_name = STITCH_FILES
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        write_text_atomic(out / json_name, json.dumps({**record, "rows": list(rows)}, indent=1) + "\n"),
        write_text_atomic(out / markdown_name, stitch_markdown(rows)),
    ]
    fig = stitch_figure(rows, record)
    try:
        paths.append(save_figure_atomic(out / figure_name, fig))
    finally:
        plt.close(fig)
    return paths


# ------------------------------------------------------------------------------- the `layerwise stitch` command
def check_stitch_options(
    task: str, steps: int, batch_size: int, warmup_steps: Optional[int], dev_blocks: int, block_size: int, text: Any
) -> int:
    """The checks of ``stitch``'s numbers (and, for causal LMs, of its text source); the warm-up steps to use."""
    if steps < 1:
        raise ValueError(f"`--steps={steps}` must be >= 1.")
    if batch_size < 1:
        raise ValueError(f"`--batch_size={batch_size}` must be >= 1.")
    warmup_steps = min(200, steps // 10) if warmup_steps is None else warmup_steps
    if not 0 <= warmup_steps <= steps:
        raise ValueError(f"`--warmup_steps={warmup_steps}` must lie in 0..--steps ({steps}).")
    if dev_blocks < 0:
        raise ValueError(f"`--dev_blocks={dev_blocks}` must be >= 0 (0: phi of the last step).")
    if task == "causal_lm":
        if block_size < 2:  # a block of one token has no next token to predict: nothing to evaluate
            raise ValueError(f"`--block_size={block_size}` must be >= 2 (each block predicts its own next tokens).")
        text.check()
    return warmup_steps


def load_pair(model_a: str, model_b: str, load_as: str, block_size: int) -> tuple[Any, Any]:
    """A and B, loaded as ``load_as``, checked to read the same token ids (and, as causal LMs, ``--block_size``)."""
    first, second = load_model_as(model_a, "--model_a", load_as), load_model_as(model_b, "--model_b", load_as)
    check_same_vocab(first, second)
    if load_as == "causal_lm":
        check_block_size(block_size, {"--model_a": first, "--model_b": second})
    return first, second


def depths(first: Any, second: Any) -> tuple[int, int]:
    """The number of blocks of A and of B."""
    from layerwise.features.paths import num_blocks

    return num_blocks(first, "--model_a"), num_blocks(second, "--model_b")


def training_loaders(data: Any, stage: str, dev_blocks: int, steps: int) -> tuple[Optional[Any], Optional[Any]]:
    """The training loader and the dev slice held out of its tail (both None when phi is not trained)."""
    if stage != "fit":
        return None, None
    training = data.train_dataloader()
    train_loader, dev_loader = hold_in_tail(training, dev_blocks)
    print(dev_slice_line(dev_blocks, dev_loader, len(training.dataset), steps))
    return train_loader, dev_loader


def check_data_choice(task: str, text_given: bool, glue_task: Optional[str], hans: bool) -> None:
    """Causal LMs read --text/--dataset, classifiers a GLUE task (and HANS only for MNLI)."""
    if task == "causal_lm" and (glue_task is not None or hans):
        raise ValueError("`--glue_task`/`--hans` are for `--task classification`; causal LMs read --text/--dataset.")
    if task != "causal_lm" and (glue_task is None or text_given):
        raise ValueError("`--task classification` reads a GLUE task: give --glue_task (and --data_dir), not --text.")
    if hans and glue_task != "mnli":
        raise ValueError(f"`--hans` evaluates MNLI classifiers; --glue_task is {glue_task!r}.")


class GlueOptions(NamedTuple):
    """The data options of ``stitch --task classification``: the GLUE task, its files and the tokenizer."""

    task: str
    data_dir: Optional[Path]
    tokenizer: str
    tokenizer_dir: Optional[Path]
    max_length: int
    batch_size: int


def glue_data(
    glue: GlueOptions,
    max_train: Optional[int],
    max_val: int,
    stage: str,
    hans: bool,
    hans_heuristic: Optional[str],
    hans_dir: Optional[Path],
) -> tuple[Any, dict[str, Any]]:
    """The GLUE task's datamodule set up for ``stage``, and ``{"hans": HANS}`` with ``hans`` (heuristic None: all)."""
    from layerwise.datamodules import GLUEDataModule, HANSDataModule

    data = GLUEDataModule(
        task=glue.task,
        data_dir=str(glue.data_dir) if glue.data_dir else None,
        tokenizer=glue.tokenizer,
        tokenizer_dir=str(glue.tokenizer_dir) if glue.tokenizer_dir else None,
        max_length=glue.max_length,
        batch_size=glue.batch_size,
        max_train_samples=max_train,
        max_val_samples=max_val,
    )
    extra: dict[str, Any] = {}
    if hans:
        extra["hans"] = HANSDataModule(
            heuristic=hans_heuristic,
            data_dir=str(hans_dir) if hans_dir else None,
            tokenizer=glue.tokenizer,
            max_length=glue.max_length,
            batch_size=glue.batch_size,
            max_val_samples=max_val,
        )
    for module in (data, *extra.values()):
        module.prepare_data()
        module.setup("validate" if module is not data else stage)
    return data, extra


def stitch_trainer_options(accelerator: str, steps: int, gradient_clip: float, precision: Optional[str]) -> dict:
    """The Lightning Trainer options of every pair's fit: one device, no logger, checkpoint, summary or bar."""
    return dict(
        accelerator=accelerator,
        devices=1,
        max_steps=steps,
        gradient_clip_val=gradient_clip,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        precision=precision or "32-true",
        num_sanity_val_steps=0,
    )


def stitch(
    model_a: str,
    model_b: str,
    task: Literal["causal_lm", "classification"] = "causal_lm",
    text: Optional[list[Path]] = None,
    dataset: Optional[str] = None,
    dataset_config: Optional[str] = None,
    glue_task: Optional[Literal["sst2", "mrpc", "qqp", "mnli", "qnli", "rte"]] = None,
    data_dir: Optional[Path] = None,
    hans: bool = False,
    hans_dir: Optional[Path] = None,
    hans_heuristic: Optional[Literal["lexical_overlap", "subsequence", "constituent"]] = "lexical_overlap",
    tokenizer: Optional[str] = None,
    tokenizer_dir: Optional[Path] = None,
    layers: Optional[list[int]] = None,
    pairs: Optional[list[str]] = None,
    phi: Literal["learned", "identity"] = "learned",
    phi_norm: Literal["none", "pre", "post"] = "none",
    phi_init: Literal["least_squares", "zero"] = "least_squares",
    steps: int = 2000,
    warmup_steps: Optional[int] = None,
    lr: float = 0.1,
    momentum: float = 0.9,
    weight_decay: float = 1e-3,
    gradient_clip: float = 1.0,
    precision: Optional[str] = None,
    block_size: int = 256,
    max_length: int = 128,
    batch_size: int = 8,
    max_train_blocks: Optional[int] = None,
    max_val_blocks: int = 64,
    dev_blocks: int = 64,
    accelerator: str = "auto",
    seed: int = 0,
    out: Path = Path("stitch"),
    overwrite: bool = False,
) -> None:
    """Stitching penalties of two causal LMs or two classifiers over a grid of layers (Brown et al., 2023).

    For each pair (l, m): B's blocks after m and head, fed A's residual stream after block l through phi, trained
    with only phi free (tuned-lens's recipe) and evaluated on held-out data. Causal LMs (``--task causal_lm``): trained
    on the first 90 % of --text (or a hub dataset's training split), penalty = L(stitched) - L(B) (and - L(A)) in nats
    per token on the rest. Classifiers (``--task classification``): a GLUE task's training and validation splits
    (--glue_task, --data_dir), the accuracy drops next to the loss penalties; ``--hans`` also evaluates every
    stitched model on HANS (an MNLI model's neutral and contradiction count as non-entailment). Writes stitch.json,
    stitch.md and stitch.png.

    Args:
        model_a: hub id, folder or layerwise checkpoint of A.
        model_b: the same for B (it must read the same token ids, and for classifiers predict the same classes).
        task: causal_lm or classification.
        text: local text files (the last 10 % is held out); causal_lm.
        dataset: a hub dataset id instead of --text; causal_lm.
        dataset_config: its configuration name.
        glue_task: the GLUE task of the classifiers (sst2, mnli, ...); classification.
        data_dir: a folder with the GLUE task's files (default: the hub's nyu-mll/glue).
        hans: also evaluate on HANS (MNLI classifiers).
        hans_dir: a folder with HANS's heuristics_evaluation_set.txt (default: the hub's jhu-cogsci/hans).
        hans_heuristic: the HANS subset (lexical_overlap is HANS-LO; null: all three).
        tokenizer: 'byte' (257 ids), 'bpe:N', 'wordpiece:N', a hub name or a folder (default: --model_a's; for a
            TransformerLens checkpoint, the one its config names).
        tokenizer_dir: folder holding trained tokenizers.
        layers: l = m pairs (default: 1 .. min(L_A, L_B) - 1).
        pairs: explicit pairs as l:m (overrides --layers).
        phi: learned, or identity (no training; equal widths).
        phi_norm: none, pre or post LayerNorm in phi.
        phi_init: least_squares (the map from A's residual after l to B's after m, fitted on the first training
            batches) or zero (identity stitching for equal widths, tuned-lens's start).
        steps: optimizer steps per pair.
        warmup_steps: linear warm-up steps, then linear decay to 0 (default: a tenth of --steps, at most 200).
        lr: SGD learning rate (tuned-lens's 1.0 * (1 - momentum)).
        momentum: Nesterov momentum.
        weight_decay: SGD weight decay.
        gradient_clip: gradient-norm clip.
        precision: Lightning precision, e.g. bf16-mixed on a GPU (default: 32-true).
        block_size: tokens per packed block (causal_lm).
        max_length: tokens per example (classification).
        batch_size: blocks or examples per batch.
        max_train_blocks: at most this many training blocks (causal_lm) or examples (classification).
        max_val_blocks: at most this many held-out blocks or examples (HANS too).
        dev_blocks: this many of the last training blocks or examples (at most a tenth of them) are kept out of
            training as a dev slice; phi ends at the step with the lowest stitched loss on it, among its start and up
            to 20 checks (best_step in each row). 0: phi of the last step.
        accelerator: Lightning accelerator (auto, cpu, gpu).
        seed: random seed of every pair's fit (phi's initialisation and the order of the training data).
        out: output folder.
        overwrite: replace the results of an earlier run in --out (without it, the command stops at them).
    """
    from layerwise.results import check_outputs_free

    source = TextSource(text, dataset, dataset_config)
    warmup_steps = check_stitch_options(task, steps, batch_size, warmup_steps, dev_blocks, block_size, source)
    check_data_choice(task, bool(text or dataset), glue_task, hans)
    check_outputs_free(out, STITCH_FILES, overwrite)
    load_as = "causal_lm" if task == "causal_lm" else "classification"
    first, second = load_pair(model_a, model_b, load_as, block_size)
    chosen = parse_pairs(layers, pairs, *depths(first, second))
    stage = "validate" if phi == "identity" else "fit"
    tokenizer_name = tokenizer or model_tokenizer(model_a)
    if task != "causal_lm":
        glue = GlueOptions(glue_task, data_dir, tokenizer_name, tokenizer_dir, max_length, batch_size)
        data, extra = glue_data(glue, max_train_blocks, max_val_blocks, stage, hans, hans_heuristic, hans_dir)
    else:
        data, extra = source.datamodule(
            tokenizer_name, tokenizer_dir, block_size, batch_size, max_train_blocks, max_val_blocks, stage,
            models={"--model_a": first, "--model_b": second},
        ), {}  # fmt: skip
    module_options = dict(
        task=load_as, phi=phi, phi_norm=phi_norm, phi_init=phi_init, lr=lr, momentum=momentum,
        weight_decay=weight_decay, warmup_steps=warmup_steps, max_steps=steps,
    )  # fmt: skip
    train_loader, dev_loader = training_loaders(data, stage, dev_blocks, steps)
    trainer_options = stitch_trainer_options(accelerator, steps, gradient_clip, precision)
    rows = stitch_sweep(
        first, second, chosen, train_loader, data.val_dataloader(), module_options, trainer_options,
        extra=extra, seed=seed, dev_loader=dev_loader,
    )  # fmt: skip
    if task == "causal_lm":
        read = {"block_size": block_size, "text": [str(path) for path in text or []], "dataset": dataset}
    else:
        read = {"glue_task": glue_task, "max_length": max_length}
        if hans:
            read.update(hans_examples=len(extra["hans"].val_dataloader().dataset), hans_heuristic=hans_heuristic)
    held_out = ("held_out_blocks" if task == "causal_lm" else "held_out_examples", len(data.val_dataloader().dataset))
    options = {key: value for key, value in module_options.items() if key != "max_steps"}
    record = {"model_a": model_a, "model_b": model_b, held_out[0]: held_out[1], **read}
    record.update(tokenizer=tokenizer or "--model_a's", batch_size=batch_size, **options, steps=steps, seed=seed)
    record["dev_blocks"] = 0 if dev_loader is None else len(dev_loader.dataset)
    print(stitch_markdown(rows), end="")
    for path in write_stitch(rows, record, out):
        print(path)
