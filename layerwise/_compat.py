"""The one place where layerwise uses a private API of a dependency, each named, pinned and tested.

``tests/test_compat.py`` fails loudly when one of them moves. Checked on: lightning 2.6.
"""

from typing import Any

CHECKED_LIGHTNING = "2.6"


def built_by_lightning_cli() -> bool:
    """Whether LightningCLI is instantiating a module right now (it hands its parsed config over as hyper-parameters).

    Private use: ``lightning.pytorch.core.mixins.hparams_mixin._given_hyperparameters``, the context variable that
    LightningCLI sets around model instantiation so that ``save_hyperparameters`` stores the config (class paths
    included) instead of the objects. No public API tells a module's ``__init__`` that it is being built by the CLI.
    Without the variable (another Lightning), modules built by the CLI fall back to ignoring objects, and
    ``load_from_checkpoint`` then needs the backbone passed in.
    """
    try:
        from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters
    except ImportError:
        return False
    value: Any = _given_hyperparameters.get()
    return value is not None
