"""Learning-rate schedules used by the shipped configs."""

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from layerwise.errors import UsageError


class WarmupCosineLR(LambdaLR):
    """Linear warm-up for ``warmup_epochs`` then cosine decay to ``min_lr_ratio`` of the base lr at ``max_epochs``.

    DeiT's recipe (Touvron et al., 2021): AdamW, 5 warm-up epochs, cosine decay. Steps once per epoch by default
    (``scheduler_interval: epoch``); count in optimizer steps with ``scheduler_interval: step``.
    """

    def __init__(
        self, optimizer: Optimizer, warmup_epochs: int = 5, max_epochs: int = 300, min_lr_ratio: float = 0.0
    ) -> None:
        if not 0 <= warmup_epochs < max_epochs:  # built inside the run (configure_optimizers): a UsageError, one line
            option = "--model.init_args.lr_scheduler.init_args"
            raise UsageError(
                f"`{option}.warmup_epochs={warmup_epochs}` must be at least 0 and below `{option}.max_epochs="
                f"{max_epochs}` (set both with a shorter --trainer.max_epochs)."
            )
        self.warmup_epochs = warmup_epochs
        self.max_epochs = max_epochs
        self.min_lr_ratio = min_lr_ratio
        super().__init__(optimizer, self.factor)

    def factor(self, epoch: int) -> float:
        """Multiplier of the base learning rate at ``epoch``."""
        if epoch < self.warmup_epochs:
            return (epoch + 1) / (self.warmup_epochs + 1)
        progress = min(1.0, (epoch - self.warmup_epochs) / (self.max_epochs - self.warmup_epochs))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
