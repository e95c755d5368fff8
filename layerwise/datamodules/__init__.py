"""LightningDataModules, one file per data family; choose one with ``--data.class_path layerwise.datamodules.X``.

Image datamodules expose ``num_classes``, ``img_size`` and ``in_chans`` right after ``__init__`` and yield batches
``(images float32 (B, C, H, W), labels int64 (B,))``. Text datamodules yield dict batches (``input_ids`` and
``attention_mask`` int64 (B, T), plus ``labels`` for classification) and expose ``vocab_size`` once their tokenizer
is loaded.
"""

import importlib
from typing import Any

from layerwise.extras import EXTRAS

# name -> module: imported on first use, so that the digits datamodule needs neither torchvision nor transformers.
_MODULES = {
    "CIFAR10DataModule": "cifar",
    "CIFAR100DataModule": "cifar",
    "COCODetectionDataModule": "coco",
    "DigitsDataModule": "digits",
    "GLUEDataModule": "glue",
    "HANSDataModule": "hans",
    "ImageNetDataModule": "imagenet",
    "TextDataModule": "text",
}
__all__ = sorted(_MODULES)


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(f"{__name__}.{_MODULES[name]}")
    except ModuleNotFoundError as error:
        extra = EXTRAS.get(str(error.name).split(".")[0])
        if extra is None:
            raise
        raise ImportError(f"{name} needs {error.name}: pip install 'layerwise[{extra}]'.") from None
    return getattr(module, name)
