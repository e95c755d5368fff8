"""Layer access for CLIP (Hugging Face ``CLIPModel``): both towers' per-layer features at their readout tokens.

App. D of Jiang et al. compares layers within and across modalities: the vision feature of layer l is the [CLS]
token of the output of vision block l, the text feature the [EOS] token of the output of text block l. Each is
also mapped into the joint image-text space by the model's own readout (vision: ``post_layernorm`` then
``visual_projection``; text: ``final_layer_norm`` then ``text_projection``), which at the last layer gives exactly
``CLIPModel.get_image_features`` / ``get_text_features``. Blocks are reached through the one hook helper
(:func:`~layerwise.features.hooks.collect_block_outputs`).
"""

from typing import NamedTuple

import torch
from torch import Tensor, nn

from layerwise.features.hooks import collect_block_outputs


class CLIPLayers(NamedTuple):
    """Per-layer features of a batch of image-caption pairs (vision L_v, text L_t layers, B pairs)."""

    vision: Tensor  # (L_v, B, d_v) [CLS] of every vision block output
    text: Tensor  # (L_t, B, d_t) [EOS] of every text block output
    vision_projected: Tensor  # (L_v, B, p) in the joint space
    text_projected: Tensor  # (L_t, B, p) in the joint space


def check_clip(model: nn.Module, option: str = "--model") -> None:
    """Raise a one-line ValueError naming ``option`` unless ``model`` is a two-tower CLIP model."""
    parts = ("vision_model", "text_model", "visual_projection", "text_projection")
    if not all(hasattr(model, part) for part in parts):
        raise ValueError(f"`{option}`: {type(model).__name__} is not a CLIP model (a transformers CLIPModel).")


def eos_positions(model: nn.Module, input_ids: Tensor) -> Tensor:
    """The [EOS] position of every caption, as ``CLIPModel`` reads it.

    Configurations with ``eos_token_id == 2`` (the original OpenAI checkpoints) take the highest token id, the
    end-of-text token; the others the first position of ``eos_token_id``.
    """
    eos = model.config.text_config.eos_token_id
    if eos == 2:
        return input_ids.argmax(dim=-1)
    return (input_ids == eos).int().argmax(dim=-1)


@torch.no_grad()
def clip_layers(model: nn.Module, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor) -> CLIPLayers:
    """Every layer's vision [CLS] and text [EOS] feature of a batch of pairs, raw and in the joint space."""
    check_clip(model)
    vision, text = model.vision_model, model.text_model
    images = collect_block_outputs(vision.encoder.layers, lambda: vision(pixel_values=pixel_values))
    captions = collect_block_outputs(
        text.encoder.layers, lambda: text(input_ids=input_ids, attention_mask=attention_mask)
    )
    cls = torch.stack([hidden[:, 0] for hidden in images])
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    eos = eos_positions(model, input_ids).to(input_ids.device)
    eot = torch.stack([hidden[rows, eos] for hidden in captions])
    return CLIPLayers(
        cls,
        eot,
        model.visual_projection(vision.post_layernorm(cls)),
        model.text_projection(text.final_layer_norm(eot)),
    )
