"""``layerwise generate`` and ``layerwise lens``: text from an intermediate layer, and the per-layer lens table.

``generate`` continues a prompt with the first ``l`` blocks and the shared head (:func:`generate_from_layer`);
``lens`` generates greedily with the full model and writes what every layer predicts at every generated position
(:func:`lens_table`) to ``lens.md`` and ``lens.png``. The model is a layerwise Lightning checkpoint (its backbone's
Hugging Face model) or a Hugging Face causal LM; layers are numbered 1..L as in the paper.
"""

import argparse
import json
from pathlib import Path
from typing import Any, Optional

from torch import nn

from layerwise.inference.generation import STRATEGIES, check_generation_options, generate_from_layer, num_blocks
from layerwise.lightning_modules.checkpoint import load_module


def _add_common_options(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", type=Path, help="a layerwise Lightning checkpoint (.ckpt) of a causal LM")
    source.add_argument("--model", help="a Hugging Face causal LM: hub name or local folder (from_pretrained)")
    parser.add_argument(
        "--tokenizer",
        help="'byte', 'bpe:N', 'wordpiece:N' (trained ones are found in --tokenizer_dir), a hub name or a folder; "
        "default: the --model folder/name (required with --checkpoint)",
    )
    parser.add_argument("--tokenizer_dir", type=Path, help="folder holding trained tokenizers (the data cache_dir)")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--max_new_tokens", type=int, default=32, help="tokens to generate (default 32)")


def build_parser() -> argparse.ArgumentParser:
    """The parser of both subcommands (``argv[0]`` is ``generate`` or ``lens``)."""
    parser = argparse.ArgumentParser(prog="layerwise", description="Generate from a layer, or show the lens table.")
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser(
        "generate",
        help="continue a prompt with the first l blocks and the shared head",
        description="Continue a prompt with blocks 1..l and the model's own final norm + LM head.",
    )
    _add_common_options(generate)
    layers = generate.add_mutually_exclusive_group()
    layers.add_argument("--layer", type=int, help="generate from this layer, 1..L (default: L, the full model)")
    layers.add_argument("--layers", type=int, nargs="+", help="generate from each of these layers (1..L)")
    generate.add_argument("--strategy", default="greedy", choices=STRATEGIES, help="decoding (default greedy)")
    generate.add_argument("--top_k", type=int, default=50, help="tokens kept by --strategy top_k (default 50)")
    generate.add_argument("--top_p", type=float, default=0.9, help="mass kept by --strategy nucleus (default 0.9)")
    generate.add_argument("--temperature", type=float, default=1.0, help="divides the logits when sampling")
    generate.add_argument(
        "--seed", type=int, default=0, help="sampling seed; every layer starts from a generator with this seed"
    )
    generate.add_argument("--out", type=Path, help="also write the prompt, options and texts to this JSON file")

    lens = commands.add_parser(
        "lens",
        help="what the shared head predicts from every layer at every generated position",
        description="Generate greedily with the full model; write lens.md and lens.png with the token and "
        "probability the shared head gives from every layer at every generated position.",
    )
    _add_common_options(lens)
    lens.add_argument("--layers", type=int, nargs="+", help="rows to show, layer numbers 1..L (default: all)")
    lens.add_argument("--out", type=Path, default=Path("."), help="folder for lens.md and lens.png (default: .)")
    return parser


def _check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Everything that can be checked before loading a model; errors name the flag."""
    if args.checkpoint is not None and not args.checkpoint.is_file():
        parser.error(f"--checkpoint {args.checkpoint}: no such file.")
    if args.checkpoint is not None and args.tokenizer is None:
        parser.error("--tokenizer is required with --checkpoint (e.g. --tokenizer byte, as the model was trained).")
    if not args.prompt:
        parser.error("--prompt is empty; give the text to continue.")
    for layer in args.layers or []:
        if layer < 1:
            parser.error(f"--layers holds {layer}: layers are numbered 1..L.")
    try:
        if args.command == "generate":
            check_generation_options(
                args.max_new_tokens, args.strategy, args.top_k, args.top_p, args.temperature, args.layer
            )
        else:
            check_generation_options(args.max_new_tokens, "greedy", 1, 1.0, 1.0)
    except ValueError as error:
        parser.error(str(error))


def load_tokenizer_from_args(args: argparse.Namespace) -> Any:
    """The tokenizer named by ``--tokenizer`` (default ``--model``); trained specs are looked up in ``--tokenizer_dir``.

    A trained tokenizer is cached as ``<tokenizer_dir>/<kind>-<vocab_size>-<corpus hash>``; without the corpus the
    hash is unknown, so the one folder matching ``<kind>-<vocab_size>-*`` is loaded.
    """
    from layerwise.datamodules.tokenizers import load_tokenizer, parse_spec

    spec = args.tokenizer or args.model
    kind, vocab_size = parse_spec(spec, "--tokenizer")
    if kind in ("bpe", "wordpiece"):
        if args.tokenizer_dir is None:
            raise ValueError(f"--tokenizer={spec!r} is a trained tokenizer: give --tokenizer_dir, the folder it is in.")
        found = sorted(path for path in args.tokenizer_dir.glob(f"{kind}-{vocab_size}-*") if path.is_dir())
        if len(found) != 1:
            raise ValueError(
                f"--tokenizer={spec!r}: expected one folder {kind}-{vocab_size}-* in --tokenizer_dir="
                f"{args.tokenizer_dir}, found {[path.name for path in found]}; pass the folder itself as --tokenizer."
            )
        spec = str(found[0])
    return load_tokenizer(spec, cache_dir=args.tokenizer_dir, option="--tokenizer")


def load_causal_lm(checkpoint: Optional[Path], model: Optional[str]) -> nn.Module:
    """The Hugging Face causal LM of a layerwise checkpoint (``module.backbone.model``) or of ``--model``."""
    if model is not None:
        from transformers import AutoModelForCausalLM

        try:
            return AutoModelForCausalLM.from_pretrained(model)
        except OSError as error:
            raise ValueError(f"--model {model!r} could not be loaded ({error}); offline, give a folder.") from None
    assert checkpoint is not None
    module = load_module(checkpoint)
    backbone = getattr(module, "backbone", None)
    if not isinstance(getattr(backbone, "model", None), nn.Module):
        raise ValueError(
            f"--checkpoint {checkpoint}: {type(module).__name__} has no `backbone.model` (a Hugging Face model)."
        )
    return backbone.model


def _check_layers(args: argparse.Namespace, total: int) -> None:
    """``--layer``/``--layers`` against the number of blocks of the loaded model."""
    flag = "--layers" if args.layers else "--layer"
    for layer in args.layers or ([args.layer] if getattr(args, "layer", None) else []):
        if layer > total:
            raise ValueError(f"{flag} holds {layer}, but the model has {total} layers (1..{total}).")


def _run_generate(args: argparse.Namespace, model: nn.Module, tokenizer: Any, total: int) -> None:
    layers = args.layers or [args.layer or total]
    prompt_ids = tokenizer(args.prompt, return_tensors="pt")["input_ids"]
    results = []
    for layer in layers:
        ids = generate_from_layer(
            model,
            prompt_ids,
            layer,
            args.max_new_tokens,
            strategy=args.strategy,
            top_k=args.top_k,
            top_p=args.top_p,
            temperature=args.temperature,
            seed=args.seed,
            eos_token_id=tokenizer.eos_token_id,
        )[0].tolist()
        text = tokenizer.decode(ids, skip_special_tokens=True)
        results.append({"layer": layer, "token_ids": ids, "text": text})
        print(f"--- layer {layer}/{total} ---\n{args.prompt}{text}")
    if args.out is not None:
        options = {key: getattr(args, key) for key in ("strategy", "top_k", "top_p", "temperature", "seed")}
        record = {"prompt": args.prompt, "num_layers": total, "max_new_tokens": args.max_new_tokens, **options}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**record, "results": results}, indent=2) + "\n", encoding="utf-8")
        print(args.out)


def _run_lens(args: argparse.Namespace, model: nn.Module, tokenizer: Any, total: int) -> None:
    from layerwise.inference.lens import lens_markdown, lens_table, write_lens

    rows = None if args.layers is None else [layer - 1 for layer in args.layers]
    table = lens_table(model, tokenizer, args.prompt, args.max_new_tokens, rows)
    print(lens_markdown(table))
    for path in write_lens(table, args.out):
        print(path)


def main(argv: Optional[list[str]] = None) -> None:
    """Command-line entry: ``layerwise generate ...`` or ``layerwise lens ...`` (``argv`` includes the subcommand)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_arguments(parser, args)
    try:
        tokenizer = load_tokenizer_from_args(args)
        model = load_causal_lm(args.checkpoint, args.model)
        total = num_blocks(model, "--checkpoint" if args.checkpoint is not None else "--model")
        _check_layers(args, total)
    except ValueError as error:
        parser.error(str(error))
    run = _run_generate if args.command == "generate" else _run_lens
    try:
        run(args, model, tokenizer, total)
    except ValueError as error:  # options that only the loaded model can check, e.g. its number of positions
        parser.error(str(error))
