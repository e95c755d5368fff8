"""Layer access for CLIP (Hugging Face ``CLIPModel``): both towers' per-layer features at their readout tokens.

App. D of Jiang et al. compares layers within and across modalities: the vision feature of layer l is the [CLS]
token of the output of vision block l, the text feature the [EOS] token of the output of text block l. Each is
also mapped into the joint image-text space by the model's own readout (vision: ``post_layernorm`` then
``visual_projection``; text: ``final_layer_norm`` then ``text_projection``), which at the last layer gives exactly
``CLIPModel.get_image_features`` / ``get_text_features``. Where each tower's parts live is the table
:data:`~layerwise.features.paths.CLIP_TOWERS`; blocks are reached through the one hook helper
(:func:`~layerwise.features.hooks.collect_block_outputs`).
"""

from typing import NamedTuple

import torch
from torch import Tensor, nn

from layerwise.features.hooks import collect_block_outputs
from layerwise.features.paths import CLIP_TOWERS, HeadSteps, get_part


class CLIPLayers(NamedTuple):
    """Per-layer features of a batch of image-caption pairs (vision L_v, text L_t layers, B pairs)."""

    vision: Tensor  # (L_v, B, d_v) [CLS] of every vision block output
    text: Tensor  # (L_t, B, d_t) [EOS] of every text block output
    vision_projected: Tensor  # (L_v, B, p) in the joint space
    text_projected: Tensor  # (L_t, B, p) in the joint space


def check_clip(model: nn.Module, option: str = "--model") -> None:
    """Raise a one-line ValueError naming ``option`` unless ``model`` has both towers of :data:`CLIP_TOWERS`."""
    parts = [path for tower in CLIP_TOWERS.values() for path in (tower.module, tower.blocks, tower.projection)]
    if not all(get_part(model, f"{path}?", option) is not None for path in parts):
        raise ValueError(f"`{option}`: {type(model).__name__} is not a CLIP model (a transformers CLIPModel).")


def clip_depths(model: nn.Module) -> dict[str, int]:
    """The number of blocks of each tower: ``{"vision": L_v, "text": L_t}``."""
    return {name: len(get_part(model, tower.blocks, "--model")) for name, tower in CLIP_TOWERS.items()}


def _tower_layers(model: nn.Module, name: str, **inputs: Tensor) -> list[Tensor]:
    tower = CLIP_TOWERS[name]
    module = get_part(model, tower.module, "--model")
    return collect_block_outputs(get_part(model, tower.blocks, "--model"), lambda: module(**inputs))


def _joint(model: nn.Module, name: str, features: Tensor) -> Tensor:
    tower = CLIP_TOWERS[name]
    return HeadSteps(model, (*tower.final_norm, tower.projection), "--model")(features)


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
    images = _tower_layers(model, "vision", pixel_values=pixel_values)
    captions = _tower_layers(model, "text", input_ids=input_ids, attention_mask=attention_mask)
    cls, eot = _readout(model, "vision", images, input_ids), _readout(model, "text", captions, input_ids)
    return CLIPLayers(cls, eot, _joint(model, "vision", cls), _joint(model, "text", eot))


def _readout(model: nn.Module, name: str, layers: list[Tensor], input_ids: Tensor) -> Tensor:
    """(L, B, d): every layer's feature at the tower's readout token ([CLS] at 0, or each caption's [EOS])."""
    if CLIP_TOWERS[name].readout == "cls":
        return torch.stack([hidden[:, 0] for hidden in layers])
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    eos = eos_positions(model, input_ids).to(input_ids.device)
    return torch.stack([hidden[rows, eos] for hidden in layers])
