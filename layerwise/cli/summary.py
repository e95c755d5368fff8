"""Lightning's model summary without the FLOPs it did not count."""

import importlib.util
from collections.abc import Sequence
from typing import Any, Optional

from lightning.pytorch.callbacks import ModelSummary, RichModelSummary
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count


class CountedModelSummary(ModelSummary):
    """Lightning's model summary (the table of modules and the parameter counts) with FLOPs only where counted.

    Lightning counts FLOPs only by running the module on its ``example_input_array``; without one (every layerwise
    module: its input depends on the data) it prints a FLOPs column of zeros and "Total FLOPs: 0". This summary then
    leaves both out and prints the rest as one plain table on stdout, with the layer tables; with counted FLOPs it is
    Lightning's own (rich when installed). ``layerwise fit`` puts it in place of Lightning's default summary.

    Args:
        max_depth: as for Lightning's ``ModelSummary`` (0 turns the summary off).
        **summarize_kwargs: passed on to Lightning's summary when FLOPs were counted.
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        super().__init__(max_depth, **summarize_kwargs)

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        """Print the summary (on global rank zero: Lightning calls it there only)."""
        if total_flops:
            lightning = RichModelSummary if importlib.util.find_spec("rich") else ModelSummary
            lightning.summarize(
                summary_data,
                total_parameters,
                trainable_parameters,
                model_size,
                total_training_modes,
                total_flops=total_flops,
                **summarize_kwargs,
            )
            return
        totals = [
            (get_human_readable_count(trainable_parameters), "Trainable params"),
            (get_human_readable_count(total_parameters - trainable_parameters), "Non-trainable params"),
            (get_human_readable_count(total_parameters), "Total params"),
            (get_formatted_model_size(model_size), "Total estimated model params size (MB)"),
            (str(total_training_modes["train"]), "Modules in train mode"),
            (str(total_training_modes["eval"]), "Modules in eval mode"),
        ]
        print(summary_table(summary_data, totals))


def summary_table(summary_data: list[tuple[str, list[str]]], totals: list[tuple[str, str]]) -> str:
    """The columns of Lightning's summary but FLOPs, one row per module, then the ``(value, label)`` totals."""
    columns = [(name, [str(value) for value in values]) for name, values in summary_data if name != "FLOPs"]
    widths = [max(len(name), *(len(value) for value in values)) for name, values in columns]
    rule = "-" * (sum(widths) + 3 * (len(widths) - 1))
    lines = [" | ".join(name.ljust(width) for (name, _), width in zip(columns, widths)).rstrip(), rule]
    for row in zip(*(values for _, values in columns)):
        lines.append(" | ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip())
    lines.append(rule)
    lines += [f"{value:<10} {label}" for value, label in totals]
    return "\n".join(lines)


def replace_default_summary(trainer: Any, configured: Optional[Sequence[Any]], defaults: Optional[dict]) -> None:
    """Lightning's default model summary -> :class:`CountedModelSummary`, unless the user configured a summary.

    ``configured``: the callbacks of the parsed config (class paths, from a config file or a flag); ``defaults``:
    LightningCLI's ``trainer_defaults``, whose ``callbacks`` are objects. A ``ModelSummary`` in either stays.
    """
    extra = (defaults or {}).get("callbacks") or []
    given = [*(configured or []), *(extra if isinstance(extra, (list, tuple)) else [extra])]
    if any("ModelSummary" in str(getattr(callback, "class_path", type(callback))) for callback in given):
        return
    lightnings = (ModelSummary, RichModelSummary)
    trainer.callbacks = [CountedModelSummary() if type(c) in lightnings else c for c in trainer.callbacks]
