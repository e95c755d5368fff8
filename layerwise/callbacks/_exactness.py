"""One truth about exactness: a multi-process ``validate``/``test`` says that the analysis counts each sample once.

Lightning warns in every multi-process ``validate``/``test`` that ``DistributedSampler`` "replicates some samples"
and advises ``devices=1`` "to ensure each sample/batch gets evaluated exactly once". For the metrics layerwise
reduces itself that is not so: every rank feeds only its real samples (the sampler's repeats at the end of a rank's
share are dropped) and the float64 sum states are all-reduced, so the analysis equals one process's (on 451 samples
over 2 and 3 ranks too: ``tests/callbacks/test_callbacks_ddp.py``). While a run holds an analysis callback, its first
one withholds Lightning's advice and says one line instead (``AnalysisCallback.setup`` and ``on_{validation,test}_
start``), in ``layerwise validate/test`` and in a plain ``Trainer.validate/test`` alike. The module's own
``<stage>/loss`` and ``<stage>/acc`` are exact too (float64 sums of the real rows, ``lightning_modules/base.py``,
``LastLayerMeans``). Values a user logs with ``self.log`` do count the repeats: where there are repeats, Lightning's
advice is given for them after the evaluation (``teardown``), naming the keys and the count.
"""

import warnings
from typing import Any

from lightning.fabric.utilities.warnings import PossibleUserWarning
from lightning.pytorch import Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.data import DistributedSampler

from layerwise._compat import REDUCED_KEYS, SAMPLER_ADVICE
from layerwise.callbacks._output import show
from layerwise.engines.sampling import evaluation_loaders
from layerwise.errors import LayerwiseWarning

EVALUATIONS = ("validate", "test")  # the stages in which Lightning gives its advice


def withhold_sampler_advice(trainer: Trainer, stage: str) -> bool:
    """In a multi-process ``validate``/``test``: Lightning's advice silenced for this process; whether it was."""
    if stage not in EVALUATIONS or trainer.world_size < 2:
        return False
    # for the rest of the process: an evaluation runs once in it (and pytest restores the filters after each test)
    warnings.filterwarnings("ignore", message=SAMPLER_ADVICE, category=PossibleUserWarning)
    return True


def say_counted_once(trainer: Trainer, stage: str) -> None:
    """The one line, on global rank zero, in place of Lightning's advice."""
    if trainer.is_global_zero:
        show(
            trainer,
            f"layerwise {stage}: {trainer.world_size} processes, and the analysis counts each sample once "
            "(DistributedSampler's repeated samples are dropped before its sums are reduced): the same numbers as on "
            "one process.",
        )


def warn_repeated_own_logs(trainer: Trainer, stage: str) -> None:
    """Lightning's advice for the values a module logged itself (not reduced by layerwise), where samples repeated."""
    own = sorted(key for key in trainer.logged_metrics if key not in REDUCED_KEYS and key != "epoch")
    loaders = trainer.val_dataloaders if stage == "validate" else trainer.test_dataloaders
    repeated, total = repeats(loaders)
    if own and repeated:
        rank_zero_warn(
            f"{', '.join(own)} (logged with `self.log`) count {repeated} of the {total} samples twice: "
            "`DistributedSampler` repeats them to give every process as many batches. Lightning advises "
            "`devices=1` (`--trainer.devices=1`) for those values; the analysis (per-layer table, summary) counts "
            "each once.",
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
