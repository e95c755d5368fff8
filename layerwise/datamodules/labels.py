"""The labels of a datamodule's sets, read without loading their inputs: what the label check before training reads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

import numpy as np
from torch.utils.data import Dataset, Subset, TensorDataset


def labelled_sets(datamodule: Any) -> Iterator[tuple[str, Dataset]]:
    """The built datasets of a datamodule, by role: ``train``, ``validation``, ``test`` and each shifted set's name."""
    for role, attribute in (("train", "train_set"), ("validation", "val_set"), ("test", "test_set")):
        dataset = getattr(datamodule, attribute, None)
        if isinstance(dataset, Dataset):
            yield role, dataset
    for name, dataset in (getattr(datamodule, "shifted_val_sets", None) or {}).items():
        yield name, dataset


def dataset_labels(dataset: Dataset) -> Optional[tuple[Optional[str], np.ndarray]]:
    """``(source, labels)`` of a dataset whose labels can be read without loading its inputs, else None.

    Knows a ``TensorDataset`` (its last tensor, when integer and 1-D), a ``Subset``, a dataset with ``labels`` or
    ``targets`` (the ``.npz`` shift sets, torchvision's CIFAR and ImageFolder), a Hugging Face split behind
    ``HubImageDataset`` and a GLUE/HANS split (``split.labels``). ``source`` is the file or folder when known.
    """
    if isinstance(dataset, Subset):
        found = dataset_labels(dataset.dataset)
        return None if found is None else (found[0], found[1][np.asarray(dataset.indices)])
    if isinstance(dataset, TensorDataset):
        labels = dataset.tensors[-1] if len(dataset.tensors) > 1 else None
        if labels is None or labels.ndim != 1 or labels.is_floating_point() or labels.is_complex():
            return None
        return None, labels.cpu().numpy()
    source = getattr(dataset, "source", None) or getattr(dataset, "root", None)
    split = getattr(dataset, "split", None)
    if split is not None and hasattr(split, "labels"):  # a GLUE/HANS TokenizedSplit
        return getattr(split, "source", source), np.asarray(split.labels)
    for attribute in ("labels", "targets"):
        labels = getattr(dataset, attribute, None)
        if labels is not None and not callable(labels):
            return (None if source is None else str(source)), np.asarray(labels)
    column = getattr(dataset, "label_column", None)
    table = getattr(dataset, "dataset", None)
    if column is not None and hasattr(table, "column_names") and column in table.column_names:
        name = getattr(getattr(table, "info", None), "dataset_name", None)
        split_name = getattr(table, "split", None)
        return f"{name or 'the Hub dataset'} ({split_name or 'split'}, column {column!r})", np.asarray(table[column])
    return None
