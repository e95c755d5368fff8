"""Loading what the commands run on: a Hugging Face causal LM and its tokenizer."""

from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import nn

from layerwise.engines.checkpoint import load_model, load_module


def load_tokenizer_spec(spec: str, tokenizer_dir: Optional[Path]) -> Any:
    """The tokenizer ``spec`` names (``byte``, ``bpe:N``, ``wordpiece:N``, a hub name or a folder).

    A trained tokenizer is cached as ``<tokenizer_dir>/<kind>-<vocab_size>-<corpus hash>``; without the corpus the
    hash is unknown, so the one folder matching ``<kind>-<vocab_size>-*`` is loaded.
    """
    from layerwise.datamodules.tokenizers import load_tokenizer, parse_spec

    kind, vocab_size = parse_spec(spec, "--tokenizer")
    if kind in ("bpe", "wordpiece"):
        if tokenizer_dir is None:
            raise ValueError(f"`--tokenizer={spec}` is a trained tokenizer: give --tokenizer_dir, the folder it is in.")
        found = sorted(path for path in Path(tokenizer_dir).glob(f"{kind}-{vocab_size}-*") if path.is_dir())
        if len(found) != 1:
            raise ValueError(
                f"`--tokenizer={spec}`: expected one folder {kind}-{vocab_size}-* in --tokenizer_dir={tokenizer_dir}, "
                f"found {[path.name for path in found]}; pass the folder itself as --tokenizer."
            )
        spec = str(found[0])
    return load_tokenizer(spec, cache_dir=tokenizer_dir, option="--tokenizer")


def load_causal_lm(
    checkpoint: Optional[Path],
    model: Optional[str],
    dtype: Optional[str] = None,
    device_map: Optional[Union[str, dict[str, Union[str, int]]]] = None,
    offload_folder: Optional[Path] = None,
) -> nn.Module:
    """The Hugging Face causal LM of a layerwise checkpoint (``module.backbone.model``) or of ``--model``.

    Either is in ``dtype`` when given (``"auto"``: as saved); a ``--model`` is placed by ``device_map`` as it loads
    (see :func:`~layerwise.engines.checkpoint.load_model`), a checkpoint is loaded whole.
    """
    if model is not None:
        return load_model(model, "--model", "causal_lm", dtype, device_map, offload_folder)
    if checkpoint is None:
        raise ValueError("Give --checkpoint (a layerwise checkpoint) or --model (a Hugging Face causal LM).")
    if device_map is not None:
        raise ValueError("--device_map places a --model as it loads; a --checkpoint is loaded whole.")
    module = load_module(checkpoint)
    hf_model = getattr(getattr(module, "backbone", None), "model", None)
    if getattr(getattr(hf_model, "config", None), "model_type", None) is None:
        raise ValueError(
            f"`--checkpoint={checkpoint}` holds a {type(module).__name__} whose backbone is not a Hugging Face "
            "causal language model; generate and lens need one (train it with HFCausalLM)."
        )
    return hf_model if dtype in (None, "auto") else hf_model.to(getattr(torch, dtype))
