"""``layerwise export``: train once, deploy at any depth.

A model trained with the shared head (``Aligned``, ``AlternatingAligned``, …) predicts from any layer ``d`` with its
own final norm + classifier. :func:`export_truncated` turns it into an ordinary model of depth ``d`` — the first
``d`` blocks plus that head — which runs without layerwise and reproduces the shared head's layer-``d`` logits:

- ``DIR/model_depth_<d>.pt``: the truncated model as a plain ``nn.Module`` (``torch.save``), for every backbone. For
  :class:`~layerwise.features.TimmViT` it is a timm ``VisionTransformer`` created with ``depth=d`` and the same other
  arguments (pooling included, as timm's ``global_pool``); for Hugging Face backbones the model class of the backbone
  (e.g. ``BertForSequenceClassification``, ``GPT2LMHeadModel``) with ``d`` layers. Load it with
  ``model = torch.load(path, weights_only=False).eval()`` (needs torch and timm / transformers, not layerwise; it
  is a pickle, so load only files you trust) and call it as the original model: ``model(images)`` gives logits.
- ``DIR/hf_depth_<d>/`` (Hugging Face backbones: :class:`~layerwise.features.HFEncoder`,
  :class:`~layerwise.features.HFCausalLM`): a ``save_pretrained`` folder whose config has ``d`` layers
  (``num_hidden_layers`` / ``n_layer`` / ``n_layers``, and ``layer_types`` cut to ``d`` where the config has it),
  holding the first ``d`` blocks and the model's own head (pooler + classifier, or final norm + LM head; a tied LM
  head stays tied and reloads to the same weights). Load it with ``AutoModelForSequenceClassification`` /
  ``AutoModelForCausalLM.from_pretrained(folder)``; the tokenizer is not part of the export.

Before anything is written the export is checked: on a random input the truncated model's logits must equal the
shared head applied to layer ``d`` of the full model. Everything is written to a temporary folder inside ``DIR``
first and renamed into place, so an interrupted export leaves no half-written file.

Usage::

    layerwise export --checkpoint runs/quickstart/version_0/checkpoints/last.ckpt --depth 4 --out deploy/
    # or let the validation summary choose: the ε-effective depth (first layer with accuracy >= 1 - ε)
    layerwise export --checkpoint .../last.ckpt --summary runs/quickstart/version_0 --epsilon 0.02 --out deploy/

``--summary`` takes a ``val_epoch_EEE_step_SSSSSSS.json`` or a log directory (its latest one); ``--relative`` uses
the depth relative to the last layer (accuracy >= Acc_L − ε) instead. The checkpoint is a layerwise Lightning checkpoint
written by ``layerwise fit`` (its hyper-parameters hold the module's and backbone's class paths).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from layerwise.commands._lazy import ANNOTATIONS_ONLY, no_grad

if ANNOTATIONS_ONLY:
    from torch import Tensor, nn

    from layerwise.features.backbone import Backbone


@dataclass(frozen=True)
class Export:
    """What :func:`export_truncated` wrote.

    Attributes:
        depth: ``d``, the number of blocks kept.
        checkpoint: ``model_depth_<d>.pt``, the truncated model as a plain ``nn.Module``.
        hf_folder: ``hf_depth_<d>/`` (``save_pretrained``) for Hugging Face backbones, else ``None``.
        max_difference: largest ``|logit difference|`` to the shared head's layer-``d`` logits on the check input
            (``None`` when the check was skipped).
    """

    depth: int
    checkpoint: Path
    hf_folder: Optional[Path]
    max_difference: Optional[float]


def export_truncated(
    module_or_backbone: nn.Module, depth: int, out_dir: Union[str, Path], verify: bool = True
) -> Export:
    """Write the first ``depth`` blocks plus the shared head as a standalone model (see the module docstring).

    Args:
        module_or_backbone: a :class:`~layerwise.lightning_modules.LayerwiseModule` (its ``backbone`` is exported)
            or a :class:`~layerwise.features.TimmViT` / :class:`~layerwise.features.HFEncoder` /
            :class:`~layerwise.features.HFCausalLM`. Its weights are copied, never changed. For ``MultiExit`` the
            export uses the shared head (the model's own), not the separate exit head of layer ``depth``.
        depth: ``d`` in ``1..L``.
        out_dir: output folder (created if needed).
        verify: check on a random input that the export reproduces the shared head's layer-``d`` logits.

    Returns:
        the written paths, see :class:`Export`.

    Raises:
        ValueError: ``depth`` outside ``1..L`` (naming ``--depth``).
        TypeError: a backbone this function cannot export.
        RuntimeError: the truncated model does not reproduce the shared head's logits (nothing is written).
    """
    from layerwise.features.hf import HFBackbone
    from layerwise.features.truncate import check_depth

    backbone = backbone_of(module_or_backbone)
    check_depth(depth, backbone.num_layers)
    truncated = truncated_model(backbone, depth)
    difference = check_truncated(backbone, truncated, depth) if verify else None
    names = {"checkpoint": f"model_depth_{depth}.pt"}
    if isinstance(backbone, HFBackbone):
        names["hf_folder"] = f"hf_depth_{depth}"
    written = _write_atomically(Path(out_dir), truncated, names)
    return Export(depth, written["checkpoint"], written.get("hf_folder"), difference)


def backbone_of(module_or_backbone: nn.Module) -> Backbone:
    """The backbone of a layerwise module, or the backbone itself; a TypeError for anything else."""
    from layerwise.features.hf import HFBackbone
    from layerwise.features.timm_vit import TimmViT

    backbone = getattr(module_or_backbone, "backbone", module_or_backbone)
    if not isinstance(backbone, (TimmViT, HFBackbone)):
        raise TypeError(
            f"layerwise export handles TimmViT, HFEncoder and HFCausalLM backbones (or a LayerwiseModule holding one), "
            f"not {type(backbone).__name__}."
        )
    return backbone


def truncated_model(backbone: Backbone, depth: int) -> nn.Module:
    """A fresh model of the backbone's family with ``depth`` blocks, holding copies of its first blocks and head."""
    from layerwise.features.truncate import truncated_copy

    return truncated_copy(backbone.model, depth)


def probe_inputs(backbone: Backbone, batch_size: int = 2, length: int = 8) -> Any:
    """A small random input of the backbone's kind (images, or token ids with an attention mask), on its device."""
    import torch

    from layerwise.features.timm_vit import TimmViT

    device = next(backbone.parameters()).device
    generator = torch.Generator().manual_seed(0)
    if isinstance(backbone, TimmViT):
        patch = backbone.model.patch_embed
        x = torch.randn(batch_size, patch.proj.in_channels, *patch.img_size, generator=generator)
        return x.to(device=device, dtype=patch.proj.weight.dtype)
    config = backbone.model.config
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or length
    length = min(length, int(positions) - 2)  # RoBERTa-style position ids start after the padding index
    input_ids = torch.randint(0, int(config.vocab_size), (batch_size, length), generator=generator)
    return {"input_ids": input_ids.to(device), "attention_mask": torch.ones_like(input_ids).to(device)}


def exported_logits(truncated: nn.Module, inputs: Any) -> Tensor:
    """The truncated model's own output logits on ``inputs`` (timm: a tensor; Hugging Face: ``.logits``)."""
    if isinstance(inputs, dict):
        return truncated(**inputs).logits
    return truncated(inputs)


@no_grad
def check_truncated(backbone: Backbone, truncated: nn.Module, depth: int) -> float:
    """Max ``|difference|`` between the truncated model and the shared head at layer ``depth`` on a random input.

    Runs on the backbone's device (the truncated model returns to the CPU afterwards); a RuntimeError when the
    difference exceeds ``max(1e-4, 16·eps) · max(1, max|logit|)`` for the logits' dtype.
    """
    import torch

    from layerwise.features.modes import eval_mode

    inputs = probe_inputs(backbone)
    device = next(backbone.parameters()).device
    try:
        with eval_mode(backbone):
            reference = backbone.head(backbone(inputs)[depth - 1])
            output = exported_logits(truncated.to(device), inputs)
    finally:
        truncated.cpu()
    if output.shape != reference.shape:
        raise RuntimeError(
            f"The exported depth-{depth} model returns logits of shape {tuple(output.shape)}, the shared head "
            f"{tuple(reference.shape)}: layerwise export does not support {type(truncated).__name__}."
        )
    difference = float((output.double() - reference.double()).abs().max())
    tolerance = max(1e-4, 16 * torch.finfo(reference.dtype).eps) * max(1.0, float(reference.abs().max()))
    if not difference <= tolerance:
        raise RuntimeError(
            f"The exported depth-{depth} model does not reproduce the shared head's layer-{depth} logits (max "
            f"|difference| {difference:.3g} > {tolerance:.3g}): layerwise export does not support "
            f"{type(truncated).__name__}; nothing was written."
        )
    return difference


def _write_atomically(out_dir: Path, truncated: nn.Module, names: dict[str, str]) -> dict[str, Path]:
    """Write every artifact through the atomic writers of ``results`` (a file or a folder each: whole or absent)."""
    import torch

    from layerwise.results import write_atomic, write_folder_atomic

    created = not out_dir.exists()
    try:
        if "hf_folder" in names:
            write_folder_atomic(out_dir / names["hf_folder"], truncated.save_pretrained)
        write_atomic(out_dir / names["checkpoint"], lambda file: torch.save(truncated, file))
    except BaseException:
        if created and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise
    return {key: out_dir / name for key, name in names.items()}


# ------------------------------------------------------------------------------------------------------- the CLI
def choose_depth(summary: dict[str, Any], epsilon: float, relative: bool = False) -> tuple[int, str]:
    """The ε-effective depth of a summary's shared-head accuracy, and a sentence saying why.

    Absolute: the first layer with ``Acc^l >= 1 − ε``; relative: ``Acc^l >= Acc^L − ε`` (L the deepest evaluated
    layer); the deepest evaluated layer when none qualifies.
    """
    from layerwise.metrics import effective_depth

    accuracy = [math.nan if value is None else float(value) for value in summary["accuracy"]]
    layers = [int(number) for number in summary.get("layers", range(1, len(accuracy) + 1))]
    depth = effective_depth(accuracy, [epsilon], layers, relative=relative)[str(epsilon)]
    target = accuracy[-1] - epsilon if relative else 1.0 - epsilon
    rule = f"Acc_l >= Acc_{layers[-1]} - {epsilon:g} = {target:.4f}" if relative else f"Acc_l >= 1 - {epsilon:g}"
    reached = accuracy[layers.index(depth)]
    if not reached >= target:
        return depth, f"no layer reaches {rule}; using the deepest evaluated layer {depth} (accuracy {reached:.4f})"
    return depth, (
        f"the {epsilon:g}-effective depth{' (relative)' if relative else ''}: layer {depth} is the first with "
        f"{rule} (accuracy {reached:.4f}; layer {layers[-1]}: {accuracy[-1]:.4f})"
    )


# ------------------------------------------------------------------------------- the `layerwise export` command
def export(
    checkpoint: Path,
    out: Path,
    depth: Optional[int] = None,
    summary: Optional[Path] = None,
    epsilon: float = 0.01,
    relative: bool = False,
    verify: bool = True,
) -> None:
    """Export the first d blocks plus the shared head of a layerwise checkpoint as a standalone model.

    Writes OUT/model_depth_<d>.pt (torch.save of the nn.Module) and, for Hugging Face models, OUT/hf_depth_<d>/
    (save_pretrained).

    Args:
        checkpoint: a layerwise Lightning checkpoint (.ckpt).
        out: output folder.
        depth: layers to keep, 1..L (default: from --summary).
        summary: a val_epoch_EEE_step_SSSSSSS.json or a log directory: choose --depth as its ε-effective depth.
        epsilon: ε of the effective depth.
        relative: ε relative to the last layer's accuracy.
        verify: check on a random input that the export reproduces the shared head's layer-d logits.
    """
    from layerwise.engines.checkpoint import load_module
    from layerwise.features.truncate import check_depth
    from layerwise.results import latest_summary, load_summary

    if depth is None and summary is None:
        raise ValueError(
            "Give --depth (layers to keep), or --summary to use the ε-effective depth of a validation run."
        )
    if depth is not None and depth < 1:
        raise ValueError(f"`--depth={depth}` must be a layer number >= 1.")
    if not 0.0 < epsilon <= 1.0:
        raise ValueError(f"`--epsilon={epsilon}` must lie in (0, 1].")
    suggestion = None
    if summary is not None:
        summary_file = latest_summary(summary, "--summary")
        content = load_summary(summary_file)
        print(f"layerwise export: summary {summary_file}")
        if not isinstance(content, dict) or not content.get("accuracy"):
            raise ValueError(
                f"`--summary={summary_file}`: no per-layer `accuracy` (validate with the analysis callbacks)."
            )
        suggestion = (*choose_depth(content, epsilon, relative), summary_file, content.get("depth"))
    module = load_module(checkpoint)
    total = backbone_of(module).num_layers
    if suggestion is not None:
        suggested, reason, summary_file, summary_layers = suggestion
        if summary_layers is not None and summary_layers != total:
            raise ValueError(
                f"`--summary={summary_file}` is of a {summary_layers}-layer model; the checkpoint has {total}."
            )
        if depth is None:
            depth = suggested
            print(f"layerwise export: depth {depth} of {total} from {summary_file}: {reason}.")
        else:
            print(f"layerwise export: --summary suggests depth {suggested} ({reason}); exporting --depth {depth}.")
    check_depth(depth, total)
    result = export_truncated(module, depth, out, verify=verify)
    print(f"{result.checkpoint}  (model = torch.load(path, weights_only=False).eval(); {depth} of {total} blocks)")
    if result.hf_folder is not None:
        print(f"{result.hf_folder}  (from_pretrained(folder) with the model's Auto class)")
    if result.max_difference is not None:
        print(f"checked: max |logit difference| to the shared head at layer {depth}: {result.max_difference:.3g}")
