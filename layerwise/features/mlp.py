"""A deep MLP of equal-width layers, with or without residual connections: the paper's ablation model (App. B.2)."""

import copy

import torch
from torch import Tensor, nn

from layerwise.features.backbone import Backbone


class MLPBlock(nn.Module):
    """One layer: ``x + GELU(Linear(LayerNorm(x)))`` with ``residual``, else ``GELU(Linear(LayerNorm(x)))``."""

    def __init__(self, width: int, residual: bool) -> None:
        super().__init__()
        self.residual = residual
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)
        self.act = nn.GELU()

    def forward(self, x: Tensor) -> Tensor:
        update = self.act(self.linear(self.norm(x)))
        return x + update if self.residual else update


class MLPBackbone(Backbone):
    """An input projection, ``depth`` equal-width :class:`MLPBlock` layers and a head (LayerNorm + Linear).

    The ablation of App. B.2 (Jiang et al.): the same network with and without residual connections, trained with
    any layerwise training mode, shows whether CKA between layers follows accuracy and COS once the residual
    stream is gone. "The output of layer l" is the output of block l.

    Args:
        in_features: input width (64 for 8x8 digits; images are flattened).
        width: the width of every layer.
        depth: number of layers L.
        num_classes: classifier outputs.
        residual: add each layer's input to its output.

    Shapes:
        ``forward(x)``: ``(B, ...)`` -> ``(L, B, width)``; ``head(h)``: ``(..., width)`` -> ``(..., num_classes)``.
    """

    def __init__(
        self, in_features: int = 64, width: int = 128, depth: int = 8, num_classes: int = 10, residual: bool = True
    ) -> None:
        super().__init__()
        option = "--model.init_args.backbone.init_args"
        for name, value in (
            ("in_features", in_features),
            ("width", width),
            ("depth", depth),
            ("num_classes", num_classes),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{option}.{name}={value!r}` must be a positive integer.")
        self.embed_in = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList(MLPBlock(width, residual) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, num_classes)
        self.in_features = in_features
        self.residual = residual
        self.num_layers, self.embed_dim, self.num_classes = depth, width, num_classes

    def _flatten(self, x: Tensor) -> Tensor:
        x = x.flatten(1)
        if x.shape[1] != self.in_features:
            raise ValueError(
                f"MLPBackbone got inputs of {x.shape[1]} features per sample; set "
                f"`--model.init_args.backbone.init_args.in_features={x.shape[1]}`."
            )
        return x

    def forward(self, x: Tensor) -> Tensor:
        """Every layer's output ``(L, B, width)``; one pass, gradients kept."""
        hidden = self.embed_in(self._flatten(x))
        outputs = []
        for block in self.blocks:
            hidden = block(hidden)
            outputs.append(hidden)
        return torch.stack(outputs)

    def embed(self, x: Tensor) -> tuple[Tensor, None]:
        """The input of layer 1 ``(B, width)`` (the MLP has no tokens: one row per sample)."""
        return self.embed_in(self._flatten(x)), None

    def run_block(self, index: int, hidden: Tensor, context: None) -> Tensor:
        """Layer ``index`` (0-based)."""
        return self.blocks[index](hidden)

    def pool(self, hidden: Tensor, context: None) -> Tensor:
        """The feature is the layer output itself."""
        return hidden

    def select(self, context: None, rows: Tensor) -> None:
        """No context to select from."""
        return None

    def head(self, h: Tensor) -> Tensor:
        """The final LayerNorm + classifier, applied to features of any leading shape."""
        return self.fc(self.norm(h))

    def head_modules(self) -> nn.Module:
        """A fresh copy of the head, e.g. for a separate exit classifier per layer."""
        return nn.Sequential(copy.deepcopy(self.norm), copy.deepcopy(self.fc))
