"""The data split behind a summary's stage (the ``split`` a summary records)."""

from typing import Any


def evaluated_split(datamodule: Any, stage: str) -> str:
    """The data split behind a summary's ``stage``: ``validation``, ``test``, or a named set (``val_corrupted``).

    ``test`` is the datamodule's ``test_split`` when it names another split (``ImageDataModule``: ``validation``,
    digits, CIFAR and ImageNet have no separate test split).
    """
    if stage == "val":
        return "validation"
    if stage == "test":
        return str(getattr(datamodule, "test_split", None) or "test")
    return stage.split("_", 1)[1] if "_" in stage else stage
