"""GLUE sequence-classification tasks (SST-2, MRPC, QQP, MNLI, QNLI, RTE) for Hugging Face encoders.

The LightningDataModule: options, tokenizer, tokenised splits and loaders. The task table and reading and checking
the files (or the Hub) live in :mod:`layerwise.datamodules.glue_tasks`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional, get_args

from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, Dataset

from layerwise.datamodules._base import check_positive_int, flag, resolve_root, split_loader
from layerwise.datamodules.glue_tasks import HUB_ID, TASKS, GLUESource, TaskSpec, TextSplit
from layerwise.datamodules.tokenizers import load_tokenizer
from layerwise.errors import LayerwiseWarning, UsageError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

Task = Literal["sst2", "mrpc", "qqp", "mnli", "qnli", "rte"]
MNLIValidation = Literal["matched", "mismatched"]
Role = Literal["train", "validation", "test"]

__all__ = ["GLUEDataModule", "MIN_MAX_LENGTH", "TASKS", "TaskSpec", "TextSplit", "TokenizedSplit", "padded_loader"]

MIN_MAX_LENGTH = 8  # room for the special tokens of a pair (4 for RoBERTa) and a couple of tokens of each text
UNBOUNDED_MODEL_LENGTH = 1_000_000  # transformers sets model_max_length to 1e30 when the model has no limit
DEFAULT_TOKENIZER_CACHE = "~/.cache/layerwise/tokenizers"


class TokenizedSplit(Dataset):
    """Tokenises one :class:`TextSplit` example at a time: ``{input_ids, attention_mask[, token_type_ids], labels}``.

    Pairs are tokenised as pairs; both texts are truncated together (longest first) to ``max_length`` tokens.
    Padding is left to the collator, per batch.
    """

    def __init__(self, split: TextSplit, tokenizer: PreTrainedTokenizerFast, max_length: int) -> None:
        self.split = split
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __len__(self) -> int:
        return len(self.split.labels)

    def __getitem__(self, index: int) -> dict[str, Any]:
        encoding = self.tokenizer(*self.split.texts[index], truncation=True, max_length=self.max_length)
        return {**encoding, "labels": self.split.labels[index]}


class GLUEDataModule(LightningDataModule):
    """One GLUE sequence-classification task, tokenised for a Hugging Face encoder (BERT, RoBERTa, DistilBERT...).

    Tasks (Hub ``nyu-mll/glue`` label ids; ``num_classes``; ``metrics``):

    - ``sst2``: one sentence; negative=0, positive=1; 2; ("accuracy",).
    - ``mrpc``: sentence pair; not_equivalent=0, equivalent=1; 2; ("accuracy", "f1").
    - ``qqp``: question pair; not_duplicate=0, duplicate=1; 2; ("accuracy", "f1").
    - ``mnli``: premise/hypothesis; entailment=0, neutral=1, contradiction=2; 3; ("accuracy",).
    - ``qnli``: question/sentence; entailment=0, not_entailment=1; 2; ("accuracy",).
    - ``rte``: sentence pair; entailment=0, not_entailment=1; 2; ("accuracy",).

    "f1" is the F1 score of the positive class 1, as GLUE reports it.

    Source: with ``data_dir``, local files in that folder or in its GLUE task subfolder (``SST-2``, ``MRPC``,
    ``QQP``, ``MNLI``, ``QNLI``, ``RTE``, as in the original GLUE download). One file per split, named
    ``train``, ``dev`` or ``validation`` (MNLI: ``dev_matched``/``validation_matched`` and
    ``dev_mismatched``/``validation_mismatched``) and optionally ``test``, with the suffix ``.tsv``, ``.csv``,
    ``.json`` (a list of records, a dict of columns, or JSON Lines) or ``.jsonl``. TSVs are read as the original
    GLUE files are, without quote handling (they contain stray quotes); a UTF-8 byte-order mark is ignored.
    Columns, either the Hub's or the original TSV's: SST-2 ``sentence``, ``label``; MRPC ``sentence1``,
    ``sentence2``, ``label`` or ``#1 String``, ``#2 String``, ``Quality``; QQP ``question1``, ``question2``,
    ``label`` or ``is_duplicate``; MNLI ``premise``, ``hypothesis``, ``label`` or ``sentence1``, ``sentence2``,
    ``gold_label``; QNLI ``question``, ``sentence``, ``label``; RTE ``sentence1``, ``sentence2``, ``label``. Other
    columns are ignored. A label is a label name (e.g. ``entailment``) or its id. Without ``data_dir``,
    ``datasets.load_dataset("nyu-mll/glue", task)``; an unreachable Hub raises ``ConnectionError`` within seconds.

    Labels: every training and validation example must have one; a row without (an empty field, -1, or a row
    with too few fields) raises ``ValueError`` naming the file and row. Nothing is skipped silently.

    Splits: ``train_dataloader`` the training split, shuffled (first ``max_train_samples`` examples if set);
    ``val_dataloader`` the validation split (MNLI: ``validation_matched`` or ``validation_mismatched`` per
    ``mnli_validation``); ``test_dataloader`` the test split if every test example has a label (e.g. a labelled
    local ``test.tsv``), otherwise, with a warning, the validation split (the Hub's and the original GLUE test
    splits are unlabelled); for MNLI ``test_dataloader`` serves the *other* validation set (mismatched when
    ``mnli_validation="matched"`` and vice versa). ``predict_dataloader`` the validation split.
    ``max_val_samples`` keeps the first examples of every evaluation split.

    Tokenizer: ``load_tokenizer(tokenizer, corpus=<the training texts, both texts of a pair>, ...)`` from
    :mod:`layerwise.datamodules.tokenizers`: ``"byte"``, ``"bpe:<vocab>"``, ``"wordpiece:<vocab>"`` (trained once
    on the training split in ``prepare_data`` and cached) or a Hub name / local path for ``AutoTokenizer``. The
    cache lives in ``tokenizer_dir``, else ``<data_dir>/tokenizers`` when ``data_dir`` is writable, else
    ``~/.cache/layerwise/tokenizers``.

    Batches: dicts padded per batch to the longest example (``DataCollatorWithPadding``): ``input_ids`` int64
    (B, T), ``attention_mask`` int64 (B, T), ``token_type_ids`` int64 (B, T) when the tokenizer produces them
    (BERT-style tokenizers do, RoBERTa's does not), ``labels`` int64 (B,); T <= ``max_length``.

    Attributes: ``num_classes`` and ``metrics`` after ``__init__``; ``tokenizer`` and ``vocab_size``
    (``len(tokenizer)``) after ``setup``.

    Args:
        task: the GLUE task.
        mnli_validation: which MNLI validation set ``val_dataloader`` serves; the other goes to ``test_dataloader``.
            Ignored for the other tasks.
        data_dir: folder with local files (see above); None loads ``nyu-mll/glue`` from the Hugging Face Hub.
        tokenizer: tokenizer spec (see above).
        tokenizer_dir: where trained tokenizers are cached (see above).
        max_length: truncate each example (both texts of a pair together, special tokens included) to this many
            tokens; at least 8.
        batch_size: examples per batch.
        num_workers: DataLoader worker processes.
        max_train_samples: keep only the first this many training examples; None keeps all.
        max_val_samples: keep only the first this many examples of each evaluation split; None keeps all.
    """

    def __init__(
        self,
        task: Task = "sst2",
        mnli_validation: MNLIValidation = "matched",
        data_dir: Optional[str] = None,
        tokenizer: str = "bert-base-uncased",
        tokenizer_dir: Optional[str] = None,
        max_length: int = 256,
        batch_size: int = 32,
        num_workers: int = 0,
        max_train_samples: Optional[int] = None,
        max_val_samples: Optional[int] = None,
    ) -> None:
        super().__init__()
        _check_choice("task", task, get_args(Task))
        _check_choice("mnli_validation", mnli_validation, get_args(MNLIValidation))
        if not isinstance(tokenizer, str) or not tokenizer.strip():
            raise ValueError(f"{flag('tokenizer')} must be a non-empty tokenizer spec, got {tokenizer!r}")
        check_positive_int("max_length", max_length, minimum=MIN_MAX_LENGTH)
        check_positive_int("batch_size", batch_size)
        check_positive_int("num_workers", num_workers, minimum=0)
        for name, value in (("max_train_samples", max_train_samples), ("max_val_samples", max_val_samples)):
            if value is not None:
                check_positive_int(name, value)
        self.task = task
        self.mnli_validation = mnli_validation
        self.spec = TASKS[task]
        self.tokenizer_spec = tokenizer
        self.tokenizer_dir = tokenizer_dir
        self.max_length = max_length
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.max_train_samples = max_train_samples
        self.max_val_samples = max_val_samples
        self.num_classes = len(self.spec.label_names)
        self.metrics = self.spec.metrics
        self.split_names: dict[str, str] = self._split_names()
        self.data_dir = resolve_root(data_dir)
        self.source = GLUESource(task, self.split_names, self.data_dir)  # finds the files now: a missing one fails
        self.files: dict[str, Optional[Path]] = self.source.files
        self.tokenizer: Optional[PreTrainedTokenizerFast] = None
        self.vocab_size: Optional[int] = None
        self.train_set: Optional[TokenizedSplit] = None
        self.val_set: Optional[TokenizedSplit] = None
        self.test_set: Optional[TokenizedSplit] = None

    def _split_names(self) -> dict[str, str]:
        """Role -> the Hub's split name; for MNLI the test role is the other validation set."""
        if self.task != "mnli":
            return {"train": "train", "validation": "validation", "test": "test"}
        other = "mismatched" if self.mnli_validation == "matched" else "matched"
        return {"train": "train", "validation": f"validation_{self.mnli_validation}", "test": f"validation_{other}"}

    # ---------------------------------------------------------------------------------------------- splits

    def read_split(self, role: Role) -> TextSplit:
        """The texts and label ids the ``role`` loader serves, before the ``max_*_samples`` caps and tokenising.

        For ``"test"`` this is the test split when every example has a label, else (with a warning) the validation
        split; for MNLI it is the other validation set. Raises :class:`~layerwise.errors.UsageError` (a
        ``ValueError``) naming the option, the file and the row for a file or row that cannot be read, and for
        unlabelled training or validation examples.
        """
        _check_choice("role", role, get_args(Role), option="read_split(role)")
        if role == "test":
            test = self.source.read(role)
            if test is not None and test.labelled:
                return test
            what = "is absent" if test is None else "has unlabelled examples"
            rank_zero_warn(
                f"GLUE {self.task}: the test split {what}; test_dataloader serves the validation split "
                f"{self.split_names['validation']!r} instead",
                category=LayerwiseWarning,
            )
            role = "validation"
        split = self.source.read(role)
        assert split is not None  # __init__ checked that the train and validation files exist
        return split

    def _training_texts(self) -> Iterator[str]:
        """Every text of the full training split, both texts of a pair: the tokenizer's training corpus."""
        for texts in self.read_split("train").texts:
            yield from texts

    # ----------------------------------------------------------------------------------------------- tokenizer

    def _tokenizer_cache_dir(self) -> Path:
        """``tokenizer_dir``, else ``<data_dir>/tokenizers`` if ``data_dir`` is writable, else the user cache."""
        if self.tokenizer_dir is not None:
            return Path(self.tokenizer_dir).expanduser().resolve()
        if self.data_dir is not None and os.access(self.data_dir, os.W_OK):
            return self.data_dir / "tokenizers"
        return Path(DEFAULT_TOKENIZER_CACHE).expanduser()

    def _corpus_key(self) -> str:
        """Identifies the training corpus: the task and the training file (path, size, mtime) or the Hub id."""
        if self.data_dir is None:
            return f"glue-{self.task}-hub-{HUB_ID}"
        path = self.files["train"]
        assert path is not None
        stat = path.stat()
        return f"glue-{self.task}-{path}-{stat.st_size}-{stat.st_mtime_ns}"

    def _load_tokenizer(self) -> PreTrainedTokenizerFast:
        tokenizer = load_tokenizer(
            self.tokenizer_spec,
            corpus=self._training_texts,
            cache_dir=self._tokenizer_cache_dir(),
            option=flag("tokenizer"),
            corpus_key=self._corpus_key(),
        )
        limit = tokenizer.model_max_length
        if limit < UNBOUNDED_MODEL_LENGTH and self.max_length > limit:
            raise UsageError(
                f"{flag('max_length')}={self.max_length} exceeds the {limit} tokens {flag('tokenizer')}="
                f"{self.tokenizer_spec} supports"
            )
        return tokenizer

    # ------------------------------------------------------------------------------------------ Lightning hooks

    def prepare_data(self) -> None:
        """Download the Hub dataset (without ``data_dir``) and train the tokenizer unless cached; once per node."""
        if self.data_dir is None:
            self.source.hub_dataset()
        self._load_tokenizer()

    def setup(self, stage: Optional[str] = None) -> None:
        """Load the tokenizer and build the splits ``stage`` needs (validation always; train for fit; test for test)."""
        if self.tokenizer is None:
            self.tokenizer = self._load_tokenizer()
            self.vocab_size = len(self.tokenizer)
            if len(self.spec.text_columns[0]) == 2 and self.tokenizer.num_special_tokens_to_add(pair=True) == 0:
                rank_zero_warn(
                    f"{flag('tokenizer')}={self.tokenizer_spec} adds no special tokens to a pair, so the two texts of "
                    f"each {self.task} example are concatenated with no separator; a BERT-style tokenizer (e.g. "
                    "'wordpiece:<vocab_size>') marks the boundary with [SEP] and token_type_ids",
                    category=LayerwiseWarning,
                )
        if self.val_set is None:
            self.val_set = self._tokenized(self.read_split("validation").head(self.max_val_samples))
        if stage in (None, "fit") and self.train_set is None:
            self.train_set = self._tokenized(self.read_split("train").head(self.max_train_samples))
        if stage in (None, "test") and self.test_set is None:
            self.test_set = self._tokenized(self.read_split("test").head(self.max_val_samples))

    def _tokenized(self, split: TextSplit) -> TokenizedSplit:
        assert self.tokenizer is not None
        return TokenizedSplit(split, self.tokenizer, self.max_length)

    def _loader(self, dataset: Optional[TokenizedSplit], role: str, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"GLUEDataModule: the {role} split is not built; call setup() first")
        return padded_loader(dataset, self.batch_size, shuffle, self.num_workers)

    def train_dataloader(self) -> DataLoader:
        """The training split, shuffled."""
        return self._loader(self.train_set, "train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        """The validation split (MNLI: the one ``mnli_validation`` names), in file order."""
        return self._loader(self.val_set, "validation", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        """The labelled test split, else the validation split; MNLI: the other validation set (see the class doc)."""
        return self._loader(self.test_set, "test", shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        """The validation split, in file order."""
        return self._loader(self.val_set, "validation", shuffle=False)


def padded_loader(dataset: TokenizedSplit, batch_size: int, shuffle: bool, num_workers: int) -> DataLoader:
    """Batches of a tokenised split, padded per batch to its longest example (``DataCollatorWithPadding``)."""
    from transformers import DataCollatorWithPadding

    collate = DataCollatorWithPadding(dataset.tokenizer, return_tensors="pt")
    return split_loader(dataset, batch_size, num_workers, shuffle, collate_fn=collate)


def _check_choice(arg: str, value: Any, choices: tuple[Any, ...], option: Optional[str] = None) -> None:
    """Raise ValueError naming the CLI flag (or ``option``) unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{option or flag(arg)} must be one of {list(choices)}, got {value!r}")
