"""The optional dependency groups, and the one way to import from them.

``pip install 'layerwise[vision]'`` brings timm and torchvision, ``[text]`` transformers, tokenizers and datasets,
``[detection]`` both plus pycocotools (the COCO evaluation behind torchmetrics' ``MeanAveragePrecision``).
The core (Lightning, torchmetrics, the metrics, callbacks and training modes) imports without them; what needs
one says which extra to install.
"""

import importlib
from types import ModuleType

EXTRAS = {
    "timm": "vision",
    "torchvision": "vision",
    "transformers": "text",
    "tokenizers": "text",
    "datasets": "text",
    "accelerate": "text",
    "pycocotools": "detection",
}


def require(module: str) -> ModuleType:
    """Import ``module``, or raise an ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        extra = EXTRAS.get(module.split(".")[0], "dev")
        raise ImportError(f"{module} is not installed: pip install 'layerwise[{extra}]' ({error}).") from None
