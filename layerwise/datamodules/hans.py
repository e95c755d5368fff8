"""HANS (McCoy et al., 2019): the out-of-distribution NLI test of models fine-tuned on MNLI, evaluation only.

HANS has two labels, entailment = 0 and non-entailment = 1, while an MNLI model has three (entailment, neutral,
contradiction). The datamodule says how the model's classes map onto its own in ``label_groups`` (default
``[[0], [1, 2]]``: MNLI's entailment, then neutral + contradiction), and a layerwise module or ``Stitched`` reading
it turns every layer's 3-way logits into 2-way ones with :func:`layerwise.metrics.functional.group_logits`:
``grouping="max"`` keeps the best logit of each group, so the accuracy is HANS's own (argmax over the three
classes, then neutral and contradiction counted as non-entailment); ``grouping="logsumexp"`` sums the probabilities
of a group (then the cross-entropy is the 2-way likelihood, and the accuracy can differ where the two disagree).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Literal, Optional, get_args

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader

from layerwise.datamodules import _hub
from layerwise.datamodules._base import check_positive_int, flag, resolve_root
from layerwise.datamodules.glue import MIN_MAX_LENGTH, TextSplit, TokenizedSplit, padded_loader
from layerwise.datamodules.tokenizers import load_tokenizer

HUB_ID = "jhu-cogsci/hans"
LABEL_NAMES = ("entailment", "non-entailment")
HEURISTICS = ("lexical_overlap", "subsequence", "constituent")
FILE_NAMES = ("heuristics_evaluation_set.txt", "heuristics_evaluation_set.tsv", "validation.jsonl", "validation.json")
Grouping = Literal["max", "logsumexp"]


class HANSDataModule(LightningDataModule):
    """The HANS evaluation set (30,000 premise/hypothesis pairs), or one heuristic's 10,000, for MNLI models.

    Source: with ``data_dir``, the original release's ``heuristics_evaluation_set.txt`` (tab-separated, columns
    ``gold_label``, ``sentence1``, ``sentence2``, ``heuristic``, ``subcase``, ...; github.com/tommccoy1/hans) or a
    ``validation.jsonl``/``.json`` with the Hub's columns (``premise``, ``hypothesis``, ``label``, ``heuristic``);
    without it, the ``validation`` split of ``hub_id`` (``jhu-cogsci/hans``) on the Hub. Labels are names or ids (0
    entailment, 1 non-entailment); an unlabelled or unknown one raises naming the file and row.

    Batches as :class:`~layerwise.datamodules.GLUEDataModule`'s (pairs, padded per batch, ``labels`` (B,)).
    ``val_dataloader``, ``test_dataloader`` and ``predict_dataloader`` all serve the evaluation set (there is no
    training split: HANS tests MNLI models).

    Args:
        heuristic: keep one heuristic (``lexical_overlap``, the HANS-LO subset of Brown et al., ``subsequence``,
            ``constituent``), None keeps all three.
        data_dir: a folder with the evaluation file (see above); None loads the Hub dataset.
        hub_id: the Hub dataset read without ``data_dir`` (its ``validation`` split).
        tokenizer: tokenizer spec of the model (a hub name or folder; see :func:`load_tokenizer`).
        max_length: truncate each pair to this many tokens.
        batch_size: examples per batch.
        num_workers: DataLoader worker processes.
        max_val_samples: keep the first this many examples (after the heuristic filter); None keeps all.
        label_groups: for each HANS label, the model classes that count as it (default: MNLI's [[0], [1, 2]]).
        grouping: how a group's logits become one (``max``: HANS's own accuracy; ``logsumexp``: summed probability).
    """

    test_split = "validation"  # one evaluation set, served by every evaluation dataloader

    def __init__(
        self,
        heuristic: Optional[Literal["lexical_overlap", "subsequence", "constituent"]] = None,
        data_dir: Optional[str] = None,
        hub_id: str = HUB_ID,
        tokenizer: str = "bert-base-uncased",
        max_length: int = 128,
        batch_size: int = 32,
        num_workers: int = 0,
        max_val_samples: Optional[int] = None,
        label_groups: Optional[list[list[int]]] = None,
        grouping: Grouping = "max",
    ) -> None:
        super().__init__()
        if heuristic is not None and heuristic not in HEURISTICS:
            raise ValueError(f"{flag('heuristic')}={heuristic!r} must be one of {list(HEURISTICS)} or null (all).")
        if grouping not in get_args(Grouping):
            raise ValueError(f"{flag('grouping')}={grouping!r} must be 'max' or 'logsumexp'.")
        groups = [[0], [1, 2]] if label_groups is None else [list(group) for group in label_groups]
        classes = sorted(index for group in groups for index in group)
        if len(groups) != len(LABEL_NAMES) or not all(groups) or classes != list(range(len(classes))):
            raise ValueError(
                f"{flag('label_groups')}={label_groups} must give, for each of {list(LABEL_NAMES)}, a non-empty list "
                "of model classes, every class 0..C-1 exactly once (MNLI models: [[0], [1, 2]])."
            )
        check_positive_int("max_length", max_length, minimum=MIN_MAX_LENGTH)
        check_positive_int("batch_size", batch_size)
        check_positive_int("num_workers", num_workers, minimum=0)
        if max_val_samples is not None:
            check_positive_int("max_val_samples", max_val_samples)
        self.heuristic, self.tokenizer_spec = heuristic, tokenizer
        self.max_length, self.batch_size, self.num_workers = max_length, batch_size, num_workers
        self.max_val_samples = max_val_samples
        self.label_groups, self.grouping = groups, grouping
        self.num_classes = len(LABEL_NAMES)
        self.model_classes = len(classes)
        self.metrics = ("accuracy",)
        self.hub_id = hub_id
        self.data_dir = resolve_root(data_dir)
        self.file = self._find_file(self.data_dir) if self.data_dir is not None else None
        self.tokenizer: Any = None
        self.vocab_size: Optional[int] = None
        self.val_set: Optional[TokenizedSplit] = None

    @staticmethod
    def _find_file(folder: Path) -> Path:
        for name in FILE_NAMES:
            if (folder / name).is_file():
                return folder / name
        raise FileNotFoundError(
            f"{flag('data_dir')}={str(folder)!r} holds none of {list(FILE_NAMES)}: download "
            "heuristics_evaluation_set.txt from github.com/tommccoy1/hans, or omit data_dir to load "
            f"{HUB_ID!r} from the Hub."
        )

    def read_split(self) -> TextSplit:
        """The pairs and labels of the evaluation set (after the heuristic filter, before ``max_val_samples``)."""
        if self.file is None:
            rows, source = self._hub_rows(), f"{self.hub_id}:validation"
        elif self.file.suffix in (".txt", ".tsv"):
            with self.file.open(encoding="utf-8", newline="") as handle:
                rows, source = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)), str(self.file)
        else:
            text = self.file.read_text(encoding="utf-8")
            rows = json.loads(text) if self.file.suffix == ".json" else [json.loads(line) for line in text.splitlines()
                                                                          if line.strip()]  # fmt: skip
            source = str(self.file)
        texts, labels = [], []
        for number, row in enumerate(rows, start=1):
            premise = row.get("sentence1", row.get("premise"))
            hypothesis = row.get("sentence2", row.get("hypothesis"))
            if not isinstance(premise, str) or not isinstance(hypothesis, str):
                raise ValueError(
                    f"{source}, row {number}: no premise/hypothesis (sentence1/sentence2 or premise/hypothesis)."
                )
            if self.heuristic is not None and row.get("heuristic") != self.heuristic:
                continue
            texts.append((premise, hypothesis))
            labels.append(self._label(row.get("gold_label", row.get("label")), source, number))
        if not texts:
            raise ValueError(f"{source}: no example with heuristic {self.heuristic!r} (`{flag('heuristic')}`).")
        return TextSplit(source, texts, labels)

    @staticmethod
    def _label(value: Any, source: str, number: int) -> int:
        if isinstance(value, str) and value.strip() in LABEL_NAMES:
            return LABEL_NAMES.index(value.strip())
        if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
            return value
        if isinstance(value, str) and value.strip() in ("0", "1"):
            return int(value)
        raise ValueError(f"{source}, row {number}: unknown HANS label {value!r}; expected {list(LABEL_NAMES)} or 0/1.")

    def _hub_dataset(self) -> Any:
        return _hub.load_hub_dataset(self.hub_id, "/path/to/hans (with heuristics_evaluation_set.txt)", "data_dir")

    def _hub_rows(self) -> list[dict[str, Any]]:
        dataset = self._hub_dataset()
        if "validation" not in dataset:
            raise ValueError(f"{flag('hub_id')}={self.hub_id} has no 'validation' split (found {sorted(dataset)}).")
        split = dataset["validation"]
        columns = [name for name in ("premise", "hypothesis", "label", "heuristic") if name in split.column_names]
        return [dict(zip(columns, values)) for values in zip(*(split[name] for name in columns))]

    def prepare_data(self) -> None:
        """Fetch the tokenizer (and, without ``data_dir``, the Hub dataset) once per node; nothing once set up.

        Every ``trainer.validate(datamodule=...)`` calls this again (``layerwise stitch``: once per layer pair).
        """
        if self.val_set is not None:
            return
        load_tokenizer(self.tokenizer_spec, option=flag("tokenizer"))
        if self.file is None:
            self._hub_dataset()

    def setup(self, stage: Optional[str] = None) -> None:
        if stage == "fit":
            raise ValueError(
                "HANSDataModule is for evaluation (`layerwise validate`/`test`): HANS has no training split here."
            )
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.tokenizer_spec, option=flag("tokenizer"))
            self.vocab_size = len(self.tokenizer)
        if self.val_set is None:
            self.val_set = TokenizedSplit(self.read_split().head(self.max_val_samples), self.tokenizer, self.max_length)

    def val_dataloader(self) -> DataLoader:
        """The evaluation set, in file order."""
        if self.val_set is None:
            raise RuntimeError("HANSDataModule: call setup() first.")
        return padded_loader(self.val_set, self.batch_size, False, self.num_workers)

    def test_dataloader(self) -> DataLoader:
        """The evaluation set, as ``val_dataloader``."""
        return self.val_dataloader()

    def predict_dataloader(self) -> DataLoader:
        """The evaluation set, as ``val_dataloader``."""
        return self.val_dataloader()
