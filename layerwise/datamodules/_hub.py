"""Loading image datasets from the Hugging Face Hub, failing within seconds when the Hub cannot be reached.

``datasets.load_dataset`` retries an unreachable Hub with exponential back-off (about 25 s per file here, longer
on a network that drops packets), so before calling it we probe the Hub endpoint once with a short, hard timeout.
In offline mode (``HF_HUB_OFFLINE=1`` or ``HF_DATASETS_OFFLINE=1``) the probe is skipped: ``load_dataset`` then reads
the local cache and fails immediately on a miss.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from torch.utils.data import Dataset

from layerwise import hub
from layerwise.datamodules._base import flag


def load_hub_dataset(hub_id: str, root_hint: str, root_flag: str = "root") -> Any:
    """``datasets.load_dataset(hub_id)``, raising at once with a message naming the CLI flags if it cannot work.

    Args:
        hub_id: Hub repository id (or a local dataset folder, which skips the probe).
        root_hint: example value for ``--data.init_args.root`` shown in errors, e.g. ``/path/to/cifar-10-batches-py``.
        root_flag: the datamodule's argument for a local copy (``root``; HANS: ``data_dir``).

    Returns:
        The ``datasets.DatasetDict`` returned by ``load_dataset``.

    Raises:
        ConnectionError: the Hub is unreachable, or offline mode is on and ``hub_id`` is not cached.
        FileNotFoundError: the Hub answered but ``hub_id`` does not exist or is gated for this account.
    """
    import datasets

    instead = f"Pass {flag(root_flag)}={root_hint} to read a local copy instead"
    if not Path(hub_id).expanduser().exists():
        hub.check_reachable(f"{flag('hub_id')}={hub_id}", instead)
    try:
        return datasets.load_dataset(hub_id)
    except ConnectionError as err:
        raise hub.HubUnreachable(
            f"Could not load {flag('hub_id')}={hub_id} from the Hugging Face Hub or its local cache ({err}). {instead}."
        ) from err
    except FileNotFoundError as err:  # includes datasets' DatasetNotFoundError (missing or gated repository)
        raise FileNotFoundError(
            f"Hugging Face dataset {flag('hub_id')}={hub_id} was not found or is not accessible ({err}); gated "
            f"datasets need `hf auth login` and accepted terms. {instead}."
        ) from err


def hub_split(dataset_dict: Any, hub_id: str, split: str, columns: tuple[str, str], num_classes: int) -> Any:
    """Pick ``split`` from a DatasetDict and check it has the image/label ``columns`` and ``num_classes`` labels."""
    if split not in dataset_dict:
        raise ValueError(f"{flag('hub_id')}={hub_id} has no '{split}' split (found {sorted(dataset_dict)})")
    dataset = dataset_dict[split]
    missing = [column for column in columns if column not in dataset.column_names]
    if missing:
        raise ValueError(
            f"{flag('hub_id')}={hub_id} split '{split}' lacks the column(s) {missing} (found {dataset.column_names})"
        )
    label_feature = dataset.features[columns[1]]
    found = getattr(label_feature, "num_classes", None)
    if found is not None and found != num_classes:
        raise ValueError(
            f"{flag('hub_id')}={hub_id} column '{columns[1]}' has {found} classes; this datamodule expects "
            f"{num_classes}"
        )
    return dataset


class HubImageDataset(Dataset):
    """Wraps one split of a Hugging Face dataset as ``(transform(RGB PIL image), int label)`` pairs.

    Args:
        dataset: a ``datasets.Dataset`` whose ``image_column`` decodes to PIL images.
        image_column: name of the image column ("img" for CIFAR, "image" for ImageNet).
        label_column: name of the integer label column ("label", or "fine_label" for CIFAR-100).
        transform: applied to the RGB PIL image.
    """

    def __init__(self, dataset: Any, image_column: str, label_column: str, transform: Optional[Callable]) -> None:
        self.dataset = dataset
        self.image_column = image_column
        self.label_column = label_column
        self.transform = transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        row = self.dataset[index]
        image = row[self.image_column].convert("RGB")  # ImageNet on the Hub holds some grayscale and CMYK JPEGs
        if self.transform is not None:
            image = self.transform(image)
        return image, int(row[self.label_column])
