"""Layer-wise COS within and across modalities for CLIP (App. D, Fig. 22-23 of Jiang et al.).

``CLIPAnalysis`` streams batches of image-caption pairs through a ``CLIPModel`` and accumulates, in float64 sum
states: the COS matrix of the vision layers ([CLS]) and of the text layers ([EOS]), the same for their projections
into the joint space, and the vision x text COS of the projected features of every pair. ``captioned`` turns an
image dataset into pairs with the caption ``"This is a photo of a {label}."``; ``layerwise clip`` is the command.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from layerwise.commands._lazy import ANNOTATIONS_ONLY

if ANNOTATIONS_ONLY:
    import torch
    from torch import nn
    from torch.utils.data import Dataset

TEMPLATE = "This is a photo of a {label}."


class CLIPAnalysis:
    """Accumulates the within- and cross-modality layer COS of a CLIP model over batches of pairs.

    Within a modality the COS is the project's (centred on the evaluated set's mean, as ``LayerCosineSimilarity``;
    ``center=False`` for raw); across modalities it is the plain cosine of the projected image and caption features
    of each pair (CLIP's own similarity, ``PairedCosine``).

    Args:
        model: a transformers ``CLIPModel`` (evaluation mode is set).
        center: centre the within-modality COS.
    """

    def __init__(self, model: nn.Module, center: bool = True) -> None:
        from layerwise.features.clip import check_clip, clip_depths
        from layerwise.metrics import LayerCosineSimilarity
        from layerwise.metrics.similarity import PairedCosine

        check_clip(model)
        self.model = model.eval()
        vision_layers, text_layers = clip_depths(model).values()
        # The widths up front: the centred states are then allocated on every rank, also one that sees no pair,
        # so that the all-reduce packs states of one length everywhere.
        config = model.config
        vision, text, joint = config.vision_config.hidden_size, config.text_config.hidden_size, config.projection_dim
        self.metrics = {
            "vision_cos": LayerCosineSimilarity(vision_layers, center, dim=vision, sync_on_compute=False),
            "text_cos": LayerCosineSimilarity(text_layers, center, dim=text, sync_on_compute=False),
            "vision_cos_projected": LayerCosineSimilarity(vision_layers, center, dim=joint, sync_on_compute=False),
            "text_cos_projected": LayerCosineSimilarity(text_layers, center, dim=joint, sync_on_compute=False),
            "cross_cos": PairedCosine(vision_layers, text_layers, sync_on_compute=False),
        }
        device = next(model.parameters()).device
        for metric in self.metrics.values():
            metric.to(device)

    def add(self, batch: dict[str, torch.Tensor]) -> None:
        """One batch of pairs: ``pixel_values``, ``input_ids``, ``attention_mask`` (a CLIPProcessor's output)."""
        from layerwise.features.clip import clip_layers

        layers = clip_layers(self.model, batch["pixel_values"], batch["input_ids"], batch["attention_mask"])
        self.metrics["vision_cos"].update(layers.vision)
        self.metrics["text_cos"].update(layers.text)
        self.metrics["vision_cos_projected"].update(layers.vision_projected)
        self.metrics["text_cos_projected"].update(layers.text_projected)
        self.metrics["cross_cos"].update(layers.vision_projected, layers.text_projected)

    def results(self) -> dict[str, Any]:
        """Every matrix (float64), summed over processes first when torch.distributed runs."""
        from layerwise.metrics.sync import all_reduce_sum_states

        all_reduce_sum_states(list(self.metrics.values()))
        results: dict[str, Any] = {name: metric.compute() for name, metric in self.metrics.items()}
        results["num_pairs"] = int(self.metrics["cross_cos"].count.item())
        results["vision_layers"] = list(range(1, results["vision_cos"].shape[0] + 1))
        results["text_layers"] = list(range(1, results["text_cos"].shape[0] + 1))
        return results


class CaptionedImages:
    """Image-caption pairs (a map-style dataset) from an image dataset of ``(image, label)``, captioned by class."""

    def __init__(self, images: Dataset, class_names: Sequence[str], template: str = TEMPLATE) -> None:
        if "{label}" not in template:
            raise ValueError(f"`--template={template!r}` must contain {{label}}.")
        self.images, self.class_names, self.template = images, list(class_names), template

    def __len__(self) -> int:
        return len(self.images)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[Any, str]:
        image, label = self.images[index]
        return image, self.template.format(label=self.class_names[int(label)])


def pair_collate(processor: Any) -> Callable[[list[tuple[Any, str]]], dict[str, torch.Tensor]]:
    """A collate function: a list of (PIL image, caption) -> the processor's padded tensors."""

    def collate(pairs: list[tuple[Any, str]]) -> dict[str, torch.Tensor]:
        images, captions = zip(*pairs)
        encoded = processor(text=list(captions), images=list(images), return_tensors="pt", padding=True)
        return {key: encoded[key] for key in ("pixel_values", "input_ids", "attention_mask")}

    return collate


def write_clip(results: dict[str, Any], out: Path) -> list[Path]:
    """``clip.json`` and the three heatmaps (``clip_vision.png``, ``clip_text.png``, ``clip_cross.png``)."""
    from layerwise.figures.clip import clip_figures
    from layerwise.results import save_figures, to_json, write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    record = to_json(results)
    paths = [write_text_atomic(out / "clip.json", json.dumps(record, indent=1) + "\n")]
    return paths + save_figures(clip_figures(record), out, "clip", ["png"])


# ------------------------------------------------------------------------------- the `layerwise clip` command
def clip(
    data: Path,
    model: str = "openai/clip-vit-base-patch32",
    template: str = "This is a photo of a {label}.",
    batch_size: int = 64,
    max_pairs: int = 2000,
    center: bool = True,
    device: Optional[str] = None,
    out: Path = Path("clip"),
    overwrite: bool = False,
) -> None:
    """Layer-wise COS of a CLIP model within and across modalities (App. D of Jiang et al.).

    Every image of --data is paired with the caption --template naming its class. Vision features: the [CLS] token
    of every vision layer; text: the [EOS] token of every text layer; both also projected into the joint space by
    the model's own post-norm and projection. Writes clip.json (vision_cos, text_cos, their _projected forms,
    cross_cos: vision x text COS of the projected features of each pair) and clip_{vision,text,cross}.png to --out.

    Args:
        data: a CIFAR-10 python folder (cifar-10-batches-py: its test split) or an image folder with one
            sub-folder per class (torchvision ImageFolder).
        model: a CLIPModel hub id or folder (with its processor).
        template: the caption, with {label} for the class name.
        batch_size: pairs per batch.
        max_pairs: read at most this many pairs (the first ones, in order).
        center: centre the within-modality COS on the evaluated mean.
        device: cpu, cuda, ... (default: cuda when available).
        out: output folder.
        overwrite: replace the results of an earlier run in --out (without it, the command stops at them).
    """
    import torch
    from torch.utils.data import DataLoader, Subset
    from transformers import AutoProcessor

    from layerwise.commands._options import check_model_path, load_model_as
    from layerwise.results import check_outputs_free

    if batch_size < 1 or max_pairs < 1:
        raise ValueError("`--batch_size` and `--max_pairs` must be >= 1.")
    check_outputs_free(out, ["clip.json", *(f"clip_{name}.png" for name in ("vision", "text", "cross"))], overwrite)
    check_model_path(model, "--model")
    images, classes = _image_dataset(data)
    pairs = CaptionedImages(images, classes, template)
    pairs = Subset(pairs, range(min(max_pairs, len(pairs))))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    analysis = CLIPAnalysis(load_model_as(model, "--model", "clip").to(device), center=center)
    loader = DataLoader(pairs, batch_size=batch_size, collate_fn=pair_collate(AutoProcessor.from_pretrained(model)))
    for batch in loader:
        analysis.add({key: value.to(device) for key, value in batch.items()})
    results = {"model": model, "template": template, **analysis.results()}
    for path in write_clip(results, out):
        print(path)


def _image_dataset(data: Path) -> tuple[Any, list[str]]:
    """(PIL image, label) pairs and the class names of --data: CIFAR-10's test split or an ImageFolder tree."""
    from torchvision import datasets

    if not data.is_dir():
        raise ValueError(f"`--data={data}`: no such folder.")
    if (data / "test_batch").is_file() and (data / "batches.meta").is_file():
        from layerwise.datamodules.cifar import LocalCIFAR10

        dataset = LocalCIFAR10(data, train=False, download=False)
        return dataset, list(dataset.classes)
    try:
        dataset = datasets.ImageFolder(str(data))
    except (FileNotFoundError, RuntimeError) as error:
        cause = str(error) if len(str(error)) <= 160 else "no class sub-folder holds an image file"
        raise ValueError(
            f"`--data={data}`: neither CIFAR-10's python folder (test_batch, batches.meta) nor an image folder with "
            f"one sub-folder of images per class ({cause})."
        ) from None
    return dataset, list(dataset.classes)
