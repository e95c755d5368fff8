"""Where the analysis callbacks' features come from: the step's outputs, or hooks on a foreign model's blocks."""

from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any, Optional

from lightning.pytorch import LightningModule
from torch import Tensor, nn

from layerwise.engines.readout import LayerOutputs, read_layers
from layerwise.features.hooks import HookTap, hook_paths
from layerwise.features.paths import HeadSteps, get_blocks
from layerwise.features.sharding import gathered_root


class FeatureSource:
    """Hooks on the blocks for the duration of one evaluation epoch (always removed), or the step's own outputs.

    Args:
        source: ``"outputs"``, ``"hooks"`` or ``"auto"`` (hooks when paths are given or the module is not a
            layerwise module).
        paths: ``blocks``, ``final_norm``, ``classifier``, ``pooling`` for the hooks (None: the path table's).
    """

    def __init__(self, source: str, paths: dict[str, Any]) -> None:
        self.source = source
        self.paths = paths
        self.tap: Optional[HookTap] = None
        self._hooks = ExitStack()

    def uses_hooks(self, pl_module: LightningModule) -> bool:
        """Whether features come from hooks for this module."""
        if self.source != "auto":
            return self.source == "hooks"
        explicit = self.paths["blocks"] is not None or self.paths["classifier"] is not None
        return explicit or not hasattr(pl_module, "layer_outputs")

    def attach(self, pl_module: LightningModule) -> None:
        """Start an epoch: attach the hooks if this module needs them."""
        self.detach()
        if self.uses_hooks(pl_module):
            self.tap = HookTap(pl_module, hook_paths(pl_module, **self.paths))
            self._hooks.enter_context(self.tap.attached())

    def detach(self) -> None:
        """Remove the hooks (idempotent)."""
        self._hooks.close()
        self.tap = None

    def shared_head(self, pl_module: LightningModule) -> Optional[nn.Module]:
        """A copy of the shared head (final norm + classifier) as it is now; None where it is not known here."""
        backbone = getattr(pl_module, "backbone", None)
        if self.uses_hooks(pl_module):
            return HeadSteps(pl_module, hook_paths(pl_module, **self.paths).shared_head).copy()
        if hasattr(backbone, "head_modules"):
            with gathered_root(backbone):  # FSDP2: the root unit's head gathered while it is copied
                return backbone.head_modules()
        return None  # a module of the user's own returning LayerOutputs: its head is not known here

    def before_batch(self, batch: Any) -> None:
        """Give the hooks the batch's attention mask (for pooling over real tokens)."""
        if self.tap is not None:
            self.tap.attention_mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None

    def outputs(self, outputs: Any, batch: Any) -> LayerOutputs:
        """The step's :class:`LayerOutputs`: the features the hooks collected read by the one readout, else its own."""
        if self.tap is not None:
            return read_layers(self.tap.head, self.tap.pop(), _targets(batch))
        if not isinstance(outputs, LayerOutputs):
            raise TypeError(
                f"The validation/test step returned {type(outputs).__name__}, not the per-layer LayerOutputs. Use a "
                "layerwise LightningModule, return `layerwise.engines.readout.read_layers(head, features, targets)`, "
                "or pass source='hooks' (with blocks=, final_norm=, classifier= for models outside the built-in path "
                "table)."
            )
        return outputs

    def depth(self, pl_module: LightningModule) -> int:
        """Number of blocks of the model, without attaching anything."""
        if self.uses_hooks(pl_module):
            return len(get_blocks(pl_module, hook_paths(pl_module, **self.paths)))
        return int(pl_module.backbone.num_layers)

    def dims(self, pl_module: LightningModule) -> tuple[int, int, int, bool]:
        """Depth, width, classes and whether every token is a sample."""
        if self.tap is not None:
            linears = [m for head in self.tap.head_modules for m in head.modules() if isinstance(m, nn.Linear)]
            if not linears:
                raise ValueError("The classifier modules hold no nn.Linear; cannot tell the feature width.")
            return self.tap.num_layers, linears[0].in_features, linears[-1].out_features, False
        backbone = pl_module.backbone
        classes = getattr(pl_module, "num_classes", None) or backbone.num_classes  # LinearProbes: the probes' own
        return backbone.num_layers, backbone.embed_dim, classes, bool(backbone.token_level)


def _targets(batch: Any) -> Optional[Tensor]:
    """The labels of a batch: its ``labels``/``label``/``targets``/``target`` entry, or its second element."""
    if isinstance(batch, Mapping):
        for key in ("labels", "label", "targets", "target"):
            if key in batch:
                return batch[key]
        return None
    if isinstance(batch, (tuple, list)) and len(batch) > 1:
        return batch[1]
    return None
