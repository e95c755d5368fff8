"""When the callbacks analyse and draw: every n-th validation epoch while fitting, and whether a fit ends on one."""

import math
from typing import Optional

from lightning.pytorch import Trainer
from lightning.pytorch.trainer.states import TrainerFn


def analyses_now(trainer: Trainer, every_n_epochs: int) -> bool:
    """Never in the sanity check; every ``every_n_epochs``-th epoch while fitting; always in validate/test."""
    if trainer.sanity_checking:
        return False
    if trainer.state.fn == TrainerFn.FITTING:
        return (trainer.current_epoch + 1) % every_n_epochs == 0
    return True


def draws_figures(trainer: Trainer, log_figures: bool, figures_every_n_epochs: int) -> bool:
    """While fitting: every ``figures_every_n_epochs``-th epoch and the last one; always in validate/test."""
    if not log_figures or trainer.state.fn != TrainerFn.FITTING:
        return log_figures
    max_epochs, max_steps = trainer.max_epochs, trainer.max_steps
    last_epoch = max_epochs is not None and max_epochs > 0 and trainer.current_epoch + 1 >= max_epochs
    last = last_epoch or (max_steps is not None and max_steps > 0 and trainer.global_step >= max_steps)
    return last or trainer.should_stop or (trainer.current_epoch + 1) % figures_every_n_epochs == 0


def last_step_unvalidated(trainer: Trainer) -> Optional[int]:
    """The optimizer step of the last validation when ``max_steps`` stops training after it, else ``None``.

    Lightning validates every ``val_check_batch`` training batches (per epoch unless ``check_val_every_n_epoch`` is
    None) and stops at ``max_steps`` without a final validation. Only the schedules that can be decided at the start
    of training are checked (step-based validation, or validation at every n-th epoch end).
    """
    max_steps = trainer.max_steps
    period = getattr(trainer, "val_check_batch", None)
    per_epoch = trainer.num_training_batches
    if max_steps is None or max_steps < 0 or not period or not math.isfinite(period):
        return None
    accumulate = trainer.accumulate_grad_batches
    if trainer.check_val_every_n_epoch is not None:
        if period != per_epoch or not math.isfinite(per_epoch):
            return None  # several validations inside each epoch: left unchecked
        period = per_epoch * trainer.check_val_every_n_epoch
    batches = max_steps * accumulate
    if batches % int(period) == 0:
        return None
    return (batches // int(period)) * int(period) // accumulate
