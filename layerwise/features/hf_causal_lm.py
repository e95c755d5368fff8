"""Layer features of Hugging Face causal language models (GPT-2, LLaMA/Mistral/Qwen-style, GPT-NeoX)."""

from typing import Any, Optional

import torch
from torch import Tensor

from layerwise.features.backbone import IGNORE_INDEX, Backbone
from layerwise.features.hf import HFBackbone, build_model

_OPTION = "--model.init_args.backbone.init_args"


class HFCausalLM(HFBackbone, Backbone):
    """A Hugging Face ``AutoModelForCausalLM`` that returns the residual stream after every block at every position.

    Every predicted position is a sample: ``h_l`` at position ``t`` is the output of block ``l`` there (before any
    final norm) and its class is the token at ``t + 1``. The *shared head* is the model's final norm followed by its
    LM head. Hugging Face's last ``hidden_states`` entry already has the final norm applied; the block outputs are
    taken with hooks instead, so the norm is applied exactly once at every layer, by the head.

    The model runs without its LM head (only its decoder), so no ``(B, T, V)`` logits are ever computed here; the
    strategies apply the head layer by layer and in token chunks.

    Args:
        model_name_or_path: hub name (``"gpt2"``) or local folder (e.g. a LLaMA checkpoint); ``None`` builds
            ``model_type`` from scratch.
        model_type: e.g. ``"gpt2"`` or ``"llama"``, with ``config_overrides`` for a model built offline.
        pretrained: load the weights (else only the named config).
        config_overrides: config fields, e.g. ``{"n_layer": 4, "n_embd": 128, "vocab_size": 257}``.
        dtype: optional dtype to load pretrained weights in, e.g. ``"bfloat16"`` for analysing a large model.
        activation_checkpointing: recompute every block in the backward pass (transformers'
            ``gradient_checkpointing_enable``): less memory for long sequences and big models, one more forward.

    Shapes:
        ``forward(inputs)``: dict of ``input_ids``/``attention_mask`` ``(B, T)`` -> ``(L, B, T, d)``.
        ``split_batch(batch)`` -> targets ``(B, T)``: the next token, ``-100`` at the last position and padding.
    """

    token_level = True

    def __init__(
        self,
        model_name_or_path: Optional[str] = None,
        model_type: Optional[str] = None,
        pretrained: bool = True,
        config_overrides: Optional[dict[str, Any]] = None,
        dtype: Optional[str] = None,
        activation_checkpointing: bool = False,
    ) -> None:
        from transformers import AutoModelForCausalLM

        extra = {"dtype": getattr(torch, dtype)} if dtype and pretrained and model_name_or_path else {}
        model = build_model(
            AutoModelForCausalLM, model_name_or_path, model_type, pretrained, config_overrides, _OPTION, **extra
        )
        super().__init__(model, f"{_OPTION}.model_type", activation_checkpointing)
        self.num_classes = int(model.config.vocab_size)

    @property
    def vocab_size(self) -> int:
        """Rows of the LM head: the number of classes."""
        return self.num_classes

    def split_batch(self, batch: Any) -> tuple[dict[str, Tensor], Tensor]:
        """Inputs and next-token targets ``(B, T)``; ``labels`` (Hugging Face convention) are shifted if given."""
        inputs = {key: batch[key] for key in ("input_ids", "attention_mask") if key in batch}
        tokens = batch.get("labels", batch["input_ids"])
        targets = torch.full_like(tokens, IGNORE_INDEX)
        targets[:, :-1] = tokens[:, 1:]
        mask = batch.get("attention_mask")
        if mask is not None:
            targets[:, :-1] = targets[:, :-1].masked_fill(mask[:, 1:] == 0, IGNORE_INDEX)
            targets = targets.masked_fill(mask == 0, IGNORE_INDEX)
        return inputs, targets

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        """Residual stream after every block: ``(L, B, T, d)``; one pass of the decoder, gradients kept."""
        decoder = self.model.get_submodule(self.model.base_model_prefix)
        outputs = self.run_collecting(lambda: decoder(**inputs, use_cache=False))
        return torch.stack(outputs)
