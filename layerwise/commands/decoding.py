"""Decoding from an intermediate layer of a Hugging Face causal LM, through the model's own shared head.

"Generating from layer l" means: run the embeddings and blocks ``1..l`` only, then the model's own final norm and LM
head (the *shared head*), exactly once per step. The model is cut with
:func:`~layerwise.features.truncate.truncated` and decoded by its own ``generate``, so greedy decoding, sampling
(top-k, nucleus), beam search, stop strings and the KV cache (of ``l`` layers) are Hugging Face's. Blocks deeper
than ``l`` are never called.

What the ``generate`` and ``lens`` commands share: the options' checks, the ``GenerationConfig`` of a strategy and
:func:`generate_from_layer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Optional

from layerwise.commands._lazy import ANNOTATIONS_ONLY, no_grad
from layerwise.commands._options import at_least

if ANNOTATIONS_ONLY:
    from torch import Tensor, nn

Strategy = Literal["greedy", "top_k", "nucleus", "beam"]
STRATEGIES: tuple[str, ...] = ("greedy", "top_k", "nucleus", "beam")


def check_generation_options(
    max_new_tokens: int,
    strategy: str,
    top_k: int,
    top_p: float,
    temperature: float,
    layer: Optional[int] = None,
    num_beams: int = 4,
) -> None:
    """Validate the decoding options, with errors naming the command-line flag (the model is not needed)."""
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int) or layer < 1):
        raise ValueError(f"`--layer={layer!r}`: give a layer number >= 1 (layer 1 is the first block).")
    at_least("max_new_tokens", max_new_tokens, 1)
    if strategy not in STRATEGIES:
        raise ValueError(f"`--strategy={strategy!r}`: choose one of {list(STRATEGIES)}.")
    at_least("top_k", top_k, 1)
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"`--top_p={top_p}`: give a probability in (0, 1].")
    if not temperature > 0.0:
        raise ValueError(f"`--temperature={temperature}`: give a positive temperature.")
    at_least("num_beams", num_beams, 1)


def generation_config(
    max_new_tokens: int,
    strategy: Strategy,
    top_k: int,
    top_p: float,
    temperature: float,
    num_beams: int,
    eos_token_id: Optional[int],
    pad_token_id: Optional[int],
    stop_strings: Optional[Sequence[str]],
    use_cache: bool,
) -> Any:
    """The ``transformers.GenerationConfig`` of a strategy; every other decoding option is off."""
    from transformers import GenerationConfig

    sampling = strategy in ("top_k", "nucleus")
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=sampling,
        num_beams=num_beams if strategy == "beam" else 1,
        temperature=temperature if sampling else 1.0,
        # top-k off: 0 while sampling (nucleus), unset otherwise (transformers warns of a flag greedy search ignores)
        top_k=top_k if strategy == "top_k" else 0 if sampling else None,
        top_p=top_p if strategy == "nucleus" else 1.0,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id if pad_token_id is not None else (eos_token_id if eos_token_id is not None else 0),
        stop_strings=list(stop_strings) if stop_strings else None,
        use_cache=use_cache,
    )


@no_grad
def generate_from_layer(
    model: nn.Module,
    input_ids: Tensor,
    layer: int,
    max_new_tokens: int,
    strategy: Strategy = "greedy",
    top_k: int = 50,
    top_p: float = 0.9,
    temperature: float = 1.0,
    num_beams: int = 4,
    seed: Optional[int] = None,
    attention_mask: Optional[Tensor] = None,
    eos_token_id: Optional[int] = None,
    pad_token_id: Optional[int] = None,
    stop_strings: Optional[Sequence[str]] = None,
    tokenizer: Any = None,
    use_cache: bool = True,
) -> Tensor:
    """Generate a continuation with the first ``layer`` blocks of a causal LM and its shared head.

    Args:
        model: a Hugging Face causal LM of a family in :data:`~layerwise.features.paths.FAMILIES`.
        input_ids: prompt ids ``(B, T)``; left-pad ragged prompts and give ``attention_mask``.
        layer: ``l`` in ``1..L``; ``L`` is the full model.
        max_new_tokens: number of tokens to generate (fewer when every row has stopped).
        strategy: ``greedy``, ``top_k`` (sample among the ``top_k`` most likely tokens), ``nucleus`` (sample from
            the smallest set of tokens whose probability reaches ``top_p``) or ``beam`` (``num_beams`` beams).
        top_k: tokens kept by ``top_k``.
        top_p: probability mass kept by ``nucleus``.
        temperature: divides the logits before sampling (not used by ``greedy`` and ``beam``).
        num_beams: beams of ``beam``.
        seed: seeds the sampling (the caller's random state is restored afterwards); ``None`` uses it as it is.
        attention_mask: ``(B, T)``, 1 for prompt tokens and 0 for padding; default all ones.
        eos_token_id: a row stops at this token.
        pad_token_id: what later positions of a stopped row hold (default the EOS token itself).
        stop_strings: a row also stops once its text ends with one of these (needs ``tokenizer``).
        tokenizer: the model's tokenizer, for ``stop_strings``.
        use_cache: reuse keys and values of earlier positions (Hugging Face's cache of ``layer`` blocks).

    Returns:
        The generated ids ``(B, N)``, without the prompt; ``N = max_new_tokens`` unless every row stopped earlier.
    """
    import torch

    from layerwise.features.modes import eval_mode
    from layerwise.features.truncate import truncated

    check_generation_options(max_new_tokens, strategy, top_k, top_p, temperature, layer, num_beams)
    if input_ids.dim() != 2 or input_ids.size(1) == 0:
        raise ValueError(f"`input_ids` must be (B, T) with T >= 1, got shape {tuple(input_ids.shape)}.")
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(input_ids.dtype)
    if mask.shape != input_ids.shape:
        raise ValueError(f"`attention_mask` {tuple(mask.shape)} must have the shape of `input_ids` {input_ids.shape}.")
    if stop_strings and tokenizer is None:
        raise ValueError("`--stop_strings` needs the model's tokenizer.")
    positions = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", None)
    if positions is not None and input_ids.shape[1] + max_new_tokens > positions:
        raise ValueError(
            f"`--max_new_tokens={max_new_tokens}`: the prompt ({input_ids.shape[1]} tokens) plus the new tokens exceed "
            f"the model's {positions} positions; ask for at most {positions - input_ids.shape[1]}."
        )
    config = generation_config(
        max_new_tokens,
        strategy,
        top_k,
        top_p,
        temperature,
        num_beams,
        eos_token_id,
        pad_token_id,
        stop_strings,
        use_cache,
    )
    devices = [input_ids.device] if input_ids.device.type == "cuda" else []
    with eval_mode(model), truncated(model, layer), torch.random.fork_rng(devices=devices, enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        output = model.generate(input_ids, attention_mask=mask, generation_config=config, tokenizer=tokenizer)
    return output[:, input_ids.shape[1] :]
