"""The ``layerwise`` command: LightningCLI (fit, validate, test, predict) plus plot, generate, lens, export, sweep."""

import importlib
import sys
from typing import Any, Optional

from lightning.pytorch.cli import LightningCLI

from layerwise.lightning_modules import LayerwiseModule
from layerwise.lightning_modules.base import check_data_compatible


class LayerwiseCLI(LightningCLI):
    """LightningCLI over every :class:`~layerwise.lightning_modules.LayerwiseModule` and any LightningDataModule.

    ``--model`` and ``--data`` take a ``class_path`` (e.g. ``layerwise.lightning_modules.AlternatingAligned``,
    ``layerwise.datamodules.DigitsDataModule``) with ``init_args``; several ``--config`` files compose.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("model_class", LayerwiseModule)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        super().__init__(*args, **kwargs)

    def _check_before_run(self) -> None:
        # Before the Trainer creates log folders or touches data: a bad combination leaves nothing behind.
        if isinstance(self.model, LayerwiseModule):
            check_data_compatible(self.model, self.datamodule)

    def before_fit(self) -> None:
        self._check_before_run()

    def before_validate(self) -> None:
        self._check_before_run()

    def before_test(self) -> None:
        self._check_before_run()

    def before_predict(self) -> None:
        self._check_before_run()


def main(args: Optional[list[str]] = None) -> None:
    """Entry point of ``layerwise`` and ``python -m layerwise``."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] == "plot":
        from layerwise.figures.plot import main as plot_main

        plot_main(argv[1:])
        return
    if argv and argv[0] in ("export", "sweep"):
        module = importlib.import_module(f"layerwise.{argv[0]}")
        module.main(argv[1:])
        return
    if argv and argv[0] in ("generate", "lens"):
        from layerwise.generate_cli import main as generate_main

        generate_main(argv)  # the subcommand stays in argv: one parser holds both
        return
    LayerwiseCLI(args=args)  # None: LightningCLI reads sys.argv itself
