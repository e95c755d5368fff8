"""Text generation from an intermediate layer of a Hugging Face causal LM, through the model's own shared head.

"Generating from layer l" means: run the embeddings and blocks ``1..l`` only, then the model's own final norm and LM
head (the *shared head*), exactly once per step. The hidden state the head sees is the residual stream after block
``l``, the same ``h_l`` that :mod:`layerwise.features` defines, so the logits equal ``head(h_l)`` of a full forward.
Blocks deeper than ``l`` are never called, and the KV cache holds ``l`` layers.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, Optional

import torch
from torch import Tensor, nn

from layerwise.features.hf import CAUSAL_LM_PATHS, resolve_paths

Strategy = Literal["greedy", "top_k", "nucleus"]
STRATEGIES: tuple[str, ...] = ("greedy", "top_k", "nucleus")


def num_blocks(model: nn.Module, option: str = "--model") -> int:
    """Number of blocks ``L`` of a causal LM known to :data:`~layerwise.features.hf.CAUSAL_LM_PATHS`."""
    return len(model.get_submodule(resolve_paths(model, CAUSAL_LM_PATHS, option).blocks))


@contextmanager
def truncated(model: nn.Module, num_blocks: int, option: str = "--layer") -> Iterator[nn.Module]:
    """Make a Hugging Face causal LM run only its first ``num_blocks`` blocks, then its own final norm and LM head.

    Inside the context, ``model(input_ids).logits`` equals ``head(h_l)`` with ``l = num_blocks``, ``h_l`` the
    residual stream after block ``l`` of a full forward and ``head`` the model's final norm + LM head. The block list
    is temporarily replaced by its first ``l`` entries (the same module objects, so hooks on blocks keep working),
    and the config fields the cache and mask code read (``num_hidden_layers``, ``layer_types``) are shortened to
    match. Everything is restored on exit, also when the body raises.

    Args:
        model: a causal LM whose ``config.model_type`` is in ``CAUSAL_LM_PATHS`` (gpt2, llama, mistral, qwen2,
            qwen3, gpt_neox).
        num_blocks: ``l`` in ``1..L``.
        option: the flag or argument named in errors.

    Yields:
        The same model, truncated.
    """
    paths = resolve_paths(model, CAUSAL_LM_PATHS, option)
    parent_path, _, name = paths.blocks.rpartition(".")
    parent = model.get_submodule(parent_path)
    blocks = getattr(parent, name)
    total = len(blocks)
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or not 1 <= num_blocks <= total:
        raise ValueError(f"`{option}={num_blocks!r}`: give a layer in 1..{total} (the model has {total} blocks).")
    config = model.config
    saved_layers = config.num_hidden_layers
    layer_types = getattr(config, "layer_types", None)
    truncate_types = isinstance(layer_types, list) and len(layer_types) == total
    setattr(parent, name, nn.ModuleList(list(blocks)[:num_blocks]))
    try:
        config.num_hidden_layers = num_blocks
        if truncate_types:
            config.layer_types = layer_types[:num_blocks]
        yield model
    finally:
        setattr(parent, name, blocks)
        config.num_hidden_layers = saved_layers
        if truncate_types:
            config.layer_types = layer_types


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Logits ``(..., V)`` with everything outside the ``k`` largest set to ``-inf`` (ties at the k-th value kept)."""
    k = min(k, logits.size(-1))
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def nucleus_filter(logits: Tensor, p: float) -> Tensor:
    """Logits ``(..., V)`` restricted to the nucleus: the smallest set of top tokens whose probability sums to ``>= p``.

    Tokens are taken in order of decreasing probability; a token is kept when the probability of the tokens before
    it is still ``< p``, so the most likely token is always kept (Holtzman et al., 2020).
    """
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs
    drop_sorted = before >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def next_tokens(
    logits: Tensor,
    strategy: Strategy = "greedy",
    top_k: int = 50,
    top_p: float = 0.9,
    temperature: float = 1.0,
    generator: Optional[torch.Generator] = None,
) -> Tensor:
    """Choose one token per row of ``logits`` ``(B, V)``: ``(B,)``.

    ``greedy`` takes the argmax (``temperature`` has no effect); ``top_k`` and ``nucleus`` divide the logits by
    ``temperature`` first (as ``transformers`` does), filter, and sample from the softmax with ``generator``.
    """
    if strategy == "greedy":
        return logits.argmax(dim=-1)
    scaled = logits.float() / temperature
    filtered = top_k_filter(scaled, top_k) if strategy == "top_k" else nucleus_filter(scaled, top_p)
    return torch.multinomial(filtered.softmax(dim=-1), 1, generator=generator).squeeze(-1)


def check_generation_options(
    max_new_tokens: int, strategy: str, top_k: int, top_p: float, temperature: float, layer: Optional[int] = None
) -> None:
    """Validate the sampling options, with errors naming the command-line flag (the model is not needed)."""
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int) or layer < 1):
        raise ValueError(f"`--layer={layer!r}`: give a layer number >= 1 (layer 1 is the first block).")
    if max_new_tokens < 1:
        raise ValueError(f"`--max_new_tokens={max_new_tokens}`: give at least 1.")
    if strategy not in STRATEGIES:
        raise ValueError(f"`--strategy={strategy!r}`: choose one of {list(STRATEGIES)}.")
    if top_k < 1:
        raise ValueError(f"`--top_k={top_k}`: give at least 1.")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"`--top_p={top_p}`: give a probability in (0, 1].")
    if not temperature > 0.0:
        raise ValueError(f"`--temperature={temperature}`: give a positive temperature.")


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Dropout off while generating; the training flag is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@torch.no_grad()
def generate_from_layer(
    model: nn.Module,
    input_ids: Tensor,
    layer: int,
    max_new_tokens: int,
    strategy: Strategy = "greedy",
    top_k: int = 50,
    top_p: float = 0.9,
    temperature: float = 1.0,
    generator: Optional[torch.Generator] = None,
    attention_mask: Optional[Tensor] = None,
    eos_token_id: Optional[int] = None,
    use_cache: bool = True,
) -> Tensor:
    """Generate a continuation with the first ``layer`` blocks of a causal LM and its shared head.

    Each step runs blocks ``1..layer`` and the final norm + LM head once (see :func:`truncated`), on the new token
    only when ``use_cache`` (the KV cache of ``layer`` blocks), on the whole sequence otherwise; both give the same
    tokens. The model runs in eval mode (its training flag is restored afterwards).

    Args:
        model: a Hugging Face causal LM known to ``CAUSAL_LM_PATHS``.
        input_ids: prompt ids ``(B, T)``; left-pad ragged prompts and give ``attention_mask``.
        layer: ``l`` in ``1..L``; ``L`` is the full model.
        max_new_tokens: number of tokens to generate (fewer when every row has produced ``eos_token_id``).
        strategy: ``greedy`` (argmax), ``top_k`` (sample among the ``top_k`` most likely tokens) or ``nucleus``
            (sample from the smallest set of tokens whose probability sums to at least ``top_p``).
        top_k: number of tokens kept by ``top_k``.
        top_p: probability mass kept by ``nucleus``.
        temperature: the logits are divided by it before sampling (not used by ``greedy``).
        generator: random generator for sampling, on the model's device; seed it for reproducible samples.
        attention_mask: ``(B, T)``, 1 for prompt tokens and 0 for padding; default all ones.
        eos_token_id: a row stops at this token; later positions of a stopped row repeat it.
        use_cache: reuse keys and values of earlier positions instead of re-running the whole sequence.

    Returns:
        The generated ids ``(B, N)``, without the prompt; ``N = max_new_tokens`` unless every row stopped earlier.
    """
    check_generation_options(max_new_tokens, strategy, top_k, top_p, temperature, layer)
    if input_ids.dim() != 2 or input_ids.size(1) == 0:
        raise ValueError(f"`input_ids` must be (B, T) with T >= 1, got shape {tuple(input_ids.shape)}.")
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(input_ids.dtype)
    if mask.shape != input_ids.shape:
        raise ValueError(f"`attention_mask` {tuple(mask.shape)} must have the shape of `input_ids` {input_ids.shape}.")
    positions = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", None)
    if positions is not None and input_ids.shape[1] + max_new_tokens > positions:
        raise ValueError(
            f"`--max_new_tokens={max_new_tokens}`: the prompt ({input_ids.shape[1]} tokens) plus the new tokens exceed "
            f"the model's {positions} positions; ask for at most {positions - input_ids.shape[1]}."
        )
    sequence = input_ids
    finished = torch.zeros(input_ids.size(0), dtype=torch.bool, device=input_ids.device)
    generated: list[Tensor] = []
    past = None
    with eval_mode(model), truncated(model, layer):
        for step in range(max_new_tokens):
            positions = (mask.cumsum(dim=-1) - 1).clamp_min(0)
            if use_cache and step > 0:
                step_ids, positions = sequence[:, -1:], positions[:, -1:]
            else:
                step_ids = sequence
            output = model(
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=past,
                use_cache=use_cache,
                logits_to_keep=1,
            )
            past = output.past_key_values if use_cache else None
            token = next_tokens(output.logits[:, -1, :], strategy, top_k, top_p, temperature, generator)
            if eos_token_id is not None:
                token = token.masked_fill(finished, eos_token_id)
                finished = finished | (token == eos_token_id)
            generated.append(token)
            sequence = torch.cat([sequence, token[:, None]], dim=1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            if bool(finished.all()):
                break
    return torch.stack(generated, dim=1)
