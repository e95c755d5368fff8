"""The ``layerwise generate`` command: continue a prompt from an intermediate layer through the shared head.

The decoding itself (blocks ``1..l``, then the model's own final norm and LM head) is
:func:`~layerwise.commands.decoding.generate_from_layer`, which ``lens`` uses too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from layerwise.commands._options import ModelSource, check_layer_numbers
from layerwise.commands.decoding import Strategy, check_generation_options, generate_from_layer


# ------------------------------------------------------------------------------- the `layerwise generate` command
def generate(
    prompt: str,
    checkpoint: Optional[Path] = None,
    model: Optional[str] = None,
    tokenizer: Optional[str] = None,
    tokenizer_dir: Optional[Path] = None,
    layer: Optional[int] = None,
    layers: Optional[list[int]] = None,
    max_new_tokens: int = 32,
    strategy: Strategy = "greedy",
    top_k: int = 50,
    top_p: float = 0.9,
    temperature: float = 1.0,
    num_beams: int = 4,
    stop_strings: Optional[list[str]] = None,
    seed: int = 0,
    out: Optional[Path] = None,
    overwrite: bool = False,
) -> None:
    """Continue a prompt with blocks 1..l and the model's own final norm + LM head (Hugging Face's generate).

    Args:
        prompt: the text to continue.
        checkpoint: a layerwise Lightning checkpoint (.ckpt) of a causal LM.
        model: a Hugging Face causal LM: hub name or local folder.
        tokenizer: 'byte', 'bpe:N', 'wordpiece:N' (trained ones are found in --tokenizer_dir), a hub name or a
            folder; default: --model (required with --checkpoint).
        tokenizer_dir: folder holding trained tokenizers (the data cache_dir).
        layer: generate from this layer, 1..L (default: L, the full model).
        layers: generate from each of these layers, 1..L.
        max_new_tokens: tokens to generate.
        strategy: greedy, top_k, nucleus or beam.
        top_k: tokens kept by top_k.
        top_p: probability mass kept by nucleus.
        temperature: divides the logits when sampling.
        num_beams: beams of beam.
        stop_strings: stop a text once it ends with one of these.
        seed: sampling seed; every layer starts from it.
        out: also write the prompt, options and texts to this JSON file.
        overwrite: replace the --out file of an earlier run (without it, the command stops at it).
    """
    from layerwise.results import check_output_free, write_text_atomic

    if layer is not None and layers:
        raise ValueError("Give --layer or --layers, not both.")
    if not prompt:
        raise ValueError("`--prompt` is empty; give the text to continue.")
    check_layer_numbers("--layers", layers or [])
    check_generation_options(max_new_tokens, strategy, top_k, top_p, temperature, layer, num_beams)
    if out is not None:
        check_output_free(out, overwrite)
    lm, tokenizer_object, total = ModelSource(checkpoint, model, tokenizer, tokenizer_dir).load()
    check_layer_numbers("--layers" if layers else "--layer", layers or ([layer] if layer else []), total)
    prompt_ids = tokenizer_object(prompt, return_tensors="pt")["input_ids"]
    options: dict[str, Any] = dict(
        strategy=strategy, top_k=top_k, top_p=top_p, temperature=temperature, num_beams=num_beams, seed=seed
    )
    results = []
    for number in layers or [layer or total]:
        ids = generate_from_layer(
            lm,
            prompt_ids,
            number,
            max_new_tokens,
            **options,
            eos_token_id=tokenizer_object.eos_token_id,
            stop_strings=stop_strings,
            tokenizer=tokenizer_object,
        )[0].tolist()
        text = tokenizer_object.decode(ids, skip_special_tokens=True)
        results.append({"layer": number, "token_ids": ids, "text": text})
        print(f"--- layer {number}/{total} ---\n{prompt}{text}")
    if out is not None:
        record = {"prompt": prompt, "num_layers": total, "max_new_tokens": max_new_tokens, **options}
        write_text_atomic(out, json.dumps({**record, "results": results}, indent=2) + "\n")
        print(out)
