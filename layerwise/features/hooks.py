"""Layer features of any model through forward hooks, for Lightning modules that know nothing of layerwise."""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from layerwise.features.outputs import FEATURES, LOGITS
from layerwise.features.pooling import check_pooling, pool_tokens


@dataclass(frozen=True)
class ModelPaths:
    """Dotted paths, relative to one model, of its blocks, final norm and classifier.

    ``final_norm`` and ``classifier`` are sequences of modules applied in order to the pooled feature; together they
    are the model's *shared head*.
    """

    blocks: str
    final_norm: tuple[str, ...]
    classifier: tuple[str, ...]
    pooling: str
    num_prefix_tokens: int = 1


def _timm_vit_paths(model: nn.Module) -> ModelPaths:
    pooling = "cls" if getattr(model, "global_pool", "token") == "token" else "mean"
    return ModelPaths("blocks", ("norm", "fc_norm"), ("head_drop", "head"), pooling, model.num_prefix_tokens)


# model class name -> paths. The one table of known families (tuned-lens style), instead of scattered checks.
PATH_TABLE: dict[str, Any] = {
    "VisionTransformer": _timm_vit_paths,
    "BertForSequenceClassification": ModelPaths(
        "bert.encoder.layer", (), ("bert.pooler.dense", "bert.pooler.activation", "dropout", "classifier"), "cls"
    ),
    "GPT2ForSequenceClassification": ModelPaths("transformer.h", ("transformer.ln_f",), ("score",), "last", 0),
    "LlamaForSequenceClassification": ModelPaths("model.layers", ("model.norm",), ("score",), "last", 0),
}


def find_paths(root: nn.Module) -> ModelPaths:
    """Find a known model family inside ``root`` and return its paths relative to ``root``."""
    for prefix, module in root.named_modules():
        entry = PATH_TABLE.get(type(module).__name__)
        if entry is None:
            continue
        paths = entry(module) if callable(entry) else entry
        dot = f"{prefix}." if prefix else ""
        return ModelPaths(
            blocks=dot + paths.blocks,
            final_norm=tuple(dot + path for path in paths.final_norm),
            classifier=tuple(dot + path for path in paths.classifier),
            pooling=paths.pooling,
            num_prefix_tokens=paths.num_prefix_tokens,
        )
    raise ValueError(
        f"layerwise does not know where the blocks, final norm and classifier of {type(root).__name__} are (known: "
        f"{sorted(PATH_TABLE)}). Give the callback their dotted paths relative to the LightningModule, e.g. "
        "`blocks='model.encoder.layers', final_norm='model.norm', classifier='model.head', pooling='cls'`."
    )


def _as_paths(value: Union[str, Sequence[str], None]) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def resolve_paths(
    root: nn.Module,
    blocks: Optional[str] = None,
    final_norm: Union[str, Sequence[str], None] = None,
    classifier: Union[str, Sequence[str], None] = None,
    pooling: Optional[str] = None,
    num_prefix_tokens: Optional[int] = None,
) -> ModelPaths:
    """Explicit paths where given (``blocks`` and ``classifier`` together), else the path table's."""
    if blocks is None and classifier is None:
        found = find_paths(root)
    elif blocks is None or classifier is None:
        raise ValueError("Give both `blocks` and `classifier` (and `final_norm` if the model has one), or neither.")
    else:
        found = ModelPaths(blocks, _as_paths(final_norm), _as_paths(classifier), "cls", 1)
    return ModelPaths(
        blocks=found.blocks,
        final_norm=found.final_norm,
        classifier=found.classifier,
        pooling=pooling or found.pooling,
        num_prefix_tokens=found.num_prefix_tokens if num_prefix_tokens is None else num_prefix_tokens,
    )


class HookTap:
    """Collect every block's pooled output with forward hooks during the model's own forward pass.

    Args:
        root: the module the paths are relative to (usually the LightningModule).
        paths: where the blocks, final norm and classifier are (see :func:`resolve_paths`).

    Use ``with tap.attached(): ...`` around the forward passes; the hooks are always removed on exit. After each
    forward pass, :meth:`pop` returns ``features`` ``(L, B, d)`` and shared-head ``logits`` ``(L, B, C)``.
    """

    def __init__(self, root: nn.Module, paths: ModelPaths) -> None:
        check_pooling(paths.pooling)
        self.paths = paths
        self.blocks = _get(root, paths.blocks, "blocks")
        if not isinstance(self.blocks, (nn.ModuleList, nn.Sequential)):
            raise ValueError(f"`blocks={paths.blocks!r}` must name a ModuleList/Sequential of transformer blocks.")
        self.head_modules = [_get(root, path, "final_norm") for path in paths.final_norm]
        self.head_modules += [_get(root, path, "classifier") for path in paths.classifier]
        self.attention_mask: Optional[Tensor] = None
        self._pooled: list[Tensor] = []

    @property
    def num_layers(self) -> int:
        """Number of blocks ``L``."""
        return len(self.blocks)

    @contextmanager
    def attached(self) -> Iterator["HookTap"]:
        """Register one forward hook per block; removed on exit, whatever happens."""
        handles = [block.register_forward_hook(self._hook) for block in self.blocks]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()
            self._pooled.clear()

    def _hook(self, module: nn.Module, args: Any, output: Any) -> None:
        tokens = output[0] if isinstance(output, (tuple, list)) else output
        pooled = pool_tokens(tokens, self.paths.pooling, self.paths.num_prefix_tokens, self.attention_mask)
        self._pooled.append(pooled.detach())

    def head(self, h: Tensor) -> Tensor:
        """The model's own final norm + classifier applied to features of any leading shape."""
        for module in self.head_modules:
            h = module(h)
        return h

    @torch.no_grad()
    def pop(self) -> dict[str, Tensor]:
        """Features and shared-head logits of the last forward pass; clears the collected outputs."""
        pooled, self._pooled = self._pooled, []
        if len(pooled) != self.num_layers:
            raise RuntimeError(
                f"Expected one output from each of the {self.num_layers} blocks in one evaluation step, got "
                f"{len(pooled)}: the step must run the model exactly once per batch."
            )
        features = torch.stack(pooled)
        return {FEATURES: features, LOGITS: self.head(features)}


def _get(root: nn.Module, path: str, option: str) -> nn.Module:
    try:
        return root.get_submodule(path)
    except AttributeError:
        raise ValueError(f"`{option}={path!r}` names no submodule of {type(root).__name__}.") from None
