"""The GLUE task table and reading a task's splits: local TSV/CSV/JSON files or the Hub, every row checked.

:data:`TASKS` says where each task keeps its texts and labels; :class:`GLUESource` finds a task's split files in a
data folder (or loads ``nyu-mll/glue``), parses them and checks every row, raising a
:class:`~layerwise.errors.UsageError` that names the option, the file and the row. No tokenizer, no Lightning:
``GLUEDataModule`` (``glue.py``) tokenises and batches what this module reads.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from layerwise import hub
from layerwise.datamodules._base import flag
from layerwise.errors import UsageError

HUB_ID = "nyu-mll/glue"
FILE_SUFFIXES = (".tsv", ".csv", ".json", ".jsonl")
UNLABELLED = -1  # the Hub's label for test rows


@dataclass(frozen=True)
class TaskSpec:
    """Where one GLUE task keeps its texts and labels, in the Hub's conventions and in the original TSV files."""

    folder: str  # the task folder of the original GLUE download, e.g. "SST-2"
    text_columns: tuple[tuple[str, ...], ...]  # accepted text column sets; the Hub's first
    label_columns: tuple[str, ...]  # accepted label columns; the Hub's first
    label_names: tuple[str, ...]  # ClassLabel names of nyu-mll/glue, in id order
    metrics: tuple[str, ...]


TASKS: dict[str, TaskSpec] = {
    "sst2": TaskSpec("SST-2", (("sentence",),), ("label",), ("negative", "positive"), ("accuracy",)),
    "mrpc": TaskSpec(
        "MRPC",
        (("sentence1", "sentence2"), ("#1 String", "#2 String")),
        ("label", "Quality"),
        ("not_equivalent", "equivalent"),
        ("accuracy", "f1"),
    ),
    "qqp": TaskSpec(
        "QQP",
        (("question1", "question2"),),
        ("label", "is_duplicate"),
        ("not_duplicate", "duplicate"),
        ("accuracy", "f1"),
    ),
    "mnli": TaskSpec(
        "MNLI",
        (("premise", "hypothesis"), ("sentence1", "sentence2")),
        ("label", "gold_label"),
        ("entailment", "neutral", "contradiction"),
        ("accuracy",),
    ),
    "qnli": TaskSpec("QNLI", (("question", "sentence"),), ("label",), ("entailment", "not_entailment"), ("accuracy",)),
    "rte": TaskSpec("RTE", (("sentence1", "sentence2"),), ("label",), ("entailment", "not_entailment"), ("accuracy",)),
}


@dataclass
class TextSplit:
    """One split as parallel lists: the text(s) of each example and its label id (``UNLABELLED`` = -1 if none).

    ``source`` names where it came from (a file path, or ``nyu-mll/glue/<task>:<split>``).
    """

    source: str
    texts: list[tuple[str, ...]]
    labels: list[int]

    @property
    def labelled(self) -> bool:
        """Whether the split is non-empty and every example has a label."""
        return bool(self.labels) and min(self.labels) >= 0

    def head(self, n: Optional[int]) -> TextSplit:
        """The first ``n`` examples (all of them if ``n`` is None)."""
        if n is None or n >= len(self.labels):
            return self
        return TextSplit(self.source, self.texts[:n], self.labels[:n])


class GLUESource:
    """One GLUE task's splits, from the files of ``data_dir`` or (``data_dir=None``) from the Hub, parsed and checked.

    Args:
        task: a key of :data:`TASKS`.
        split_names: role (``train``, ``validation``, ``test``) -> the Hub's split name it reads (MNLI's test role
            is the other validation set).
        data_dir: the folder with the split files (see ``GLUEDataModule``), or None for the Hub.

    ``files`` (role -> path, None for an absent test file) is found at construction: a missing folder or a missing
    train/validation file raises ``FileNotFoundError`` then, naming ``--data.init_args.data_dir``.
    """

    def __init__(self, task: str, split_names: dict[str, str], data_dir: Optional[Path]) -> None:
        self.task = task
        self.spec = TASKS[task]
        self.num_classes = len(self.spec.label_names)
        self.split_names = split_names
        self.data_dir = data_dir
        self.files: dict[str, Optional[Path]] = self._find_files(data_dir) if data_dir is not None else {}
        self._hub_data: Any = None

    def read(self, role: str) -> Optional[TextSplit]:
        """The split of ``role`` as read (None: no local test file); unlabelled rows only where ``role`` is test."""
        if self.data_dir is None:
            return self._hub_split(role)
        path = self.files[role]
        return None if path is None else self._read_file(path, role)

    # ---------------------------------------------------------------------------------------------- local files

    def _find_files(self, data_dir: Path) -> dict[str, Optional[Path]]:
        """Role -> local file, looked up in ``data_dir`` and then in ``data_dir/<GLUE task folder>``."""
        hint = f"Pass `{flag('data_dir')}=/path/to/{self.spec.folder}` or omit it to load {HUB_ID!r} from the Hub."
        if not data_dir.is_dir():
            raise FileNotFoundError(f"`{flag('data_dir')}={data_dir}`: no such folder. {hint}")
        folder = data_dir
        if _split_file(data_dir, "train") is None and (data_dir / self.spec.folder).is_dir():
            folder = data_dir / self.spec.folder
        files = {role: _split_file(folder, name) for role, name in self.split_names.items()}
        for role in ("train", "validation"):
            if files[role] is None:
                expected = [f"{stem}{{{','.join(FILE_SUFFIXES)}}}" for stem in _stems(self.split_names[role])]
                raise FileNotFoundError(
                    f"`{flag('data_dir')}={data_dir}`: no {self.task} {role} file {' or '.join(expected)} in "
                    f"{str(folder)!r}. {hint}"
                )
        return files

    def _read_file(self, path: Path, role: str) -> TextSplit:
        """Parse one local file (the accepted formats: ``GLUEDataModule``'s docstring)."""
        labels_required = role != "test"
        if path.suffix.lower() in (".tsv", ".csv"):
            dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if path.suffix.lower() == ".tsv" else {}
            with path.open(encoding="utf-8-sig", newline="") as file:
                reader = csv.DictReader(file, **dialect)
                return self._to_split(str(path), list(reader.fieldnames or []), reader, labels_required)
        records = _json_records(path, self.option())
        columns = list(dict.fromkeys(key for record in records for key in record))
        return self._to_split(str(path), columns, records, labels_required)

    def option(self) -> str:
        """The option that chose the data a message is about: ``data_dir`` for local files, else ``task`` (Hub)."""
        if self.data_dir is None:
            return f"`{flag('task')}={self.task}`"
        return f"`{flag('data_dir')}={self.data_dir}`"

    def _to_split(
        self, source: str, columns: list[str], rows: Iterable[dict[str, Any]], labels_required: bool
    ) -> TextSplit:
        """Pick the text and label columns of this task and convert every row, rejecting unlabelled ones if asked.

        Raises:
            UsageError: naming the option, the file and the row: an empty file, a file without the task's columns
                or without rows, a row without text, or an unlabelled or unknown label where one is required.
        """
        where = self.option()
        if not columns:
            raise UsageError(f"{where}: {source} is empty; give a file with a header row and {self.task} examples.")
        text_columns = next((names for names in self.spec.text_columns if set(names) <= set(columns)), None)
        if text_columns is None:
            raise UsageError(
                f"{where}: {source} lacks the {self.task} text column(s): expected one of "
                f"{list(self.spec.text_columns)}, found {columns}"
            )
        label_column = next((name for name in self.spec.label_columns if name in columns), None)
        if label_column is None and labels_required:
            raise UsageError(
                f"{where}: {source} has no {self.task} label column: expected one of {list(self.spec.label_columns)}, "
                f"found {columns}"
            )
        texts, labels = [], []
        for row_number, row in enumerate(rows, start=1):
            text = tuple(row.get(name) for name in text_columns)
            if not all(isinstance(part, str) for part in text):
                raise UsageError(
                    f"{where}: {source}, row {row_number}: no text in column(s) {list(text_columns)} (got {text})"
                )
            label = UNLABELLED if label_column is None else self._label_id(row.get(label_column), source, row_number)
            if label == UNLABELLED and labels_required:
                raise UsageError(
                    f"{where}: {source}, row {row_number}: no label in column {label_column!r} (got "
                    f"{row.get(label_column)!r}); every training and validation example needs one of "
                    f"{list(self.spec.label_names)} or an id in 0..{self.num_classes - 1}"
                )
            texts.append(text)
            labels.append(label)
        if not texts:
            raise UsageError(f"{where}: {source} has a header but no rows; give a file with examples.")
        return TextSplit(source, texts, labels)

    def _label_id(self, value: Any, source: str, row_number: int) -> int:
        """A label name or id -> the Hub's label id; None, "" and -1 -> ``UNLABELLED``."""
        if isinstance(value, str):
            value = value.strip()
            if value in self.spec.label_names:
                return self.spec.label_names.index(value)
            if value == "":
                return UNLABELLED
            try:
                value = int(value)
            except ValueError:
                pass  # reported below
        if value is None or value == UNLABELLED:
            return UNLABELLED
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < self.num_classes:
            return value
        raise UsageError(
            f"{self.option()}: {source}, row {row_number}: unknown {self.task} label {value!r}; expected one of "
            f"{list(self.spec.label_names)} or an id in 0..{self.num_classes - 1}"
        )

    # ------------------------------------------------------------------------------------------------------ Hub

    def hub_dataset(self) -> Any:
        """The ``nyu-mll/glue`` DatasetDict of this task, loaded once per process."""
        if self._hub_data is None:
            self._hub_data = _load_glue_hub(self.task)
        return self._hub_data

    def _hub_split(self, role: str) -> TextSplit:
        """The Hub split of ``role``, its label names checked against the table."""
        split = self.split_names[role]
        dataset_dict = self.hub_dataset()
        if split not in dataset_dict:
            raise UsageError(
                f"{self.option()}: {HUB_ID}/{self.task} has no '{split}' split (found {sorted(dataset_dict)})"
            )
        dataset = dataset_dict[split]
        source = f"{HUB_ID}/{self.task}:{split}"
        label_names = getattr(dataset.features.get("label"), "names", None)
        if label_names is not None and tuple(label_names) != self.spec.label_names:
            raise UsageError(
                f"{self.option()}: {source} has the label names {label_names}; expected {list(self.spec.label_names)}"
            )
        columns = [name for name in (*self.spec.text_columns[0], "label") if name in dataset.column_names]
        rows = (dict(zip(columns, values)) for values in zip(*(dataset[name] for name in columns)))
        return self._to_split(source, dataset.column_names, rows, labels_required=role != "test")


def _stems(split: str) -> tuple[str, ...]:
    """File names (without suffix) of a Hub split: its own name, and the original GLUE name (dev for validation)."""
    return tuple(dict.fromkeys((split, split.replace("validation", "dev"))))


def _split_file(folder: Path, split: str) -> Optional[Path]:
    """The one file in ``folder`` holding the Hub split ``split`` (see ``_stems``), or None; several is an error."""
    found = [
        folder / f"{stem}{suffix}"
        for stem in _stems(split)
        for suffix in FILE_SUFFIXES
        if (folder / f"{stem}{suffix}").is_file()
    ]
    if len(found) > 1:
        raise ValueError(
            f"{flag('data_dir')}={str(folder)!r} holds several files for the {split} split: "
            f"{[path.name for path in found]}; keep one"
        )
    return found[0] if found else None


def _json_records(path: Path, where: str) -> list[dict[str, Any]]:
    """Records of a JSON file: a list of records, a dict of equal-length columns, or JSON Lines.

    ``where`` (the option that named the file) begins the message of a ``UsageError`` for what is not a record.
    """
    text = path.read_text(encoding="utf-8-sig")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # several documents: JSON Lines, as datasets' Dataset.to_json writes by default
        if isinstance(data, list):
            return _records_only(data, path, where, "item")
        if isinstance(data, dict) and data and all(isinstance(column, list) for column in data.values()):
            return [dict(zip(data, values)) for values in zip(*data.values())]
    records = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise UsageError(f"{where}: {path}, line {line_number}: not a JSON record ({err})") from err
    return _records_only(records, path, where, "line")


def _records_only(records: list[Any], path: Path, where: str, unit: str) -> list[dict[str, Any]]:
    """``records`` if every one is a JSON object, else a ``UsageError`` naming the first that is not."""
    for number, record in enumerate(records, start=1):
        if not isinstance(record, dict):
            raise UsageError(f"{where}: {path}, {unit} {number}: not a JSON record (an object), got {record!r:.60}")
    return records


def _load_glue_hub(task: str) -> Any:
    """``datasets.load_dataset("nyu-mll/glue", task)``, raising at once with a message naming the CLI flags.

    Raises:
        ConnectionError: the Hub is unreachable, or offline mode is on and the task is not cached.
        FileNotFoundError: the Hub answered but the dataset was not found.
    """
    import datasets

    instead = f"Pass `{flag('data_dir')}=/path/to/{TASKS[task].folder}` (a folder with train.tsv and dev.tsv) instead"
    hub.check_reachable(f"{HUB_ID!r} config {task!r} ({flag('task')}={task})", instead)
    try:
        return datasets.load_dataset(HUB_ID, task)
    except ConnectionError as err:
        raise hub.HubUnreachable(
            f"Could not load {HUB_ID!r} config {task!r} from the Hugging Face Hub or its local cache ({err}). "
            f"{instead}."
        ) from err
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"Hugging Face dataset {HUB_ID!r} config {task!r} is not accessible ({err}). {instead}."
        ) from err
