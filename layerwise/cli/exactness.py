"""One truth about exactness: a multi-process ``validate``/``test`` says that the analysis counts each sample once.

Lightning warns in every multi-process ``validate``/``test`` that ``DistributedSampler`` "replicates some samples"
and advises ``devices=1`` "to ensure each sample/batch gets evaluated exactly once". For the metrics layerwise
reduces itself that is not so: every rank feeds only its real samples (the sampler's repeats at the end of a rank's
share are dropped) and the float64 sum states are all-reduced, so the analysis equals one process's (on 451 samples
over 2 and 3 ranks too: ``tests/callbacks/test_callbacks_ddp.py``). :class:`ExactnessLine` withholds Lightning's
advice while the run holds an analysis callback and prints one line saying so instead. The module's own
``<stage>/loss`` and ``<stage>/acc`` are exact too (float64 sums of the real rows, ``lightning_modules/base.py``,
``LastLayerMeans``). Values a user logs with ``self.log`` do count the repeats: where there are repeats, Lightning's
advice is given for them after the evaluation, naming the keys and the count.
"""

import warnings
from typing import Any

from lightning.fabric.utilities.warnings import PossibleUserWarning
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.data import DistributedSampler

from layerwise._compat import REDUCED_KEYS, SAMPLER_ADVICE
from layerwise.callbacks import AnalysisCallback
from layerwise.engines.sampling import evaluation_loaders
from layerwise.errors import LayerwiseWarning


class ExactnessLine(Callback):
    """Lightning's DistributedSampler advice replaced by one line, for the analysis; kept for the module's own logs.

    Args:
        command: ``validate`` or ``test``.
    """

    def __init__(self, command: str) -> None:
        self.command = command
        self._filtered = False

    @classmethod
    def for_command(cls, command: str) -> list["ExactnessLine"]:
        """The callback for ``validate``/``test``; none for the other commands (Lightning warns in those two only)."""
        return [cls(command)] if command in ("validate", "test") else []

    def _analysed(self, trainer: Trainer) -> bool:
        callbacks = getattr(trainer, "callbacks", [])
        return trainer.world_size > 1 and any(isinstance(c, AnalysisCallback) for c in callbacks)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != self.command or not self._analysed(trainer):
            return
        # for the rest of the process: a command runs once in it (and pytest restores the filters after each test)
        warnings.filterwarnings("ignore", message=SAMPLER_ADVICE, category=PossibleUserWarning)
        self._filtered = True

    def _start(self, trainer: Trainer) -> None:
        if self._filtered and trainer.is_global_zero:
            print(
                f"layerwise {self.command}: {trainer.world_size} processes, and the analysis counts each sample once "
                "(DistributedSampler's repeated samples are dropped before its sums are reduced): the same numbers "
                "as on one process.",
                flush=True,
            )

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start(trainer)

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start(trainer)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if not self._filtered or stage != self.command:
            return
        own = sorted(key for key in trainer.logged_metrics if key not in REDUCED_KEYS and key != "epoch")
        loaders = trainer.val_dataloaders if self.command == "validate" else trainer.test_dataloaders
        repeated, total = repeats(loaders)
        if own and repeated:
            rank_zero_warn(
                f"{', '.join(own)} (logged with `self.log`) count {repeated} of the {total} samples twice: "
                "`DistributedSampler` repeats them to give every process as many batches. Lightning advises "
                "`--trainer.devices=1` for those values; the analysis (per-layer table, summary) counts each once.",
                category=LayerwiseWarning,
            )


def repeats(loaders: Any) -> tuple[int, int]:
    """How many samples ``DistributedSampler`` repeats over all ranks of the evaluation ``loaders``, and of how many."""
    repeated = total = 0
    for loader in evaluation_loaders(loaders):
        sampler = getattr(loader, "sampler", None)
        sampler = getattr(getattr(loader, "batch_sampler", None), "sampler", sampler)
        if isinstance(sampler, DistributedSampler) and not sampler.drop_last:
            size = len(sampler.dataset)  # type: ignore[arg-type]
            repeated, total = repeated + max(0, sampler.total_size - size), total + size
    return repeated, total
