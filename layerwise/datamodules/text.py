"""Causal language modelling on plain text: local UTF-8 files or a Hugging Face text dataset such as Wikitext-103."""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from transformers import PreTrainedTokenizerFast

from layerwise import hub
from layerwise.datamodules._base import check_positive_int, flag, split_loader
from layerwise.datamodules.tokenizers import TRAINED_KINDS, load_tokenizer, parse_spec
from layerwise.errors import LayerwiseWarning, UsageError

USER_TOKENIZER_CACHE = "~/.cache/layerwise/tokenizers"
TEXT_COLUMN = "text"
READ_CHARS = 1 << 20  # characters read from a file at a time
ROWS_PER_CHUNK = 10_000  # dataset rows joined into one text chunk
PIECES_PER_CALL = 4096  # pieces encoded per call of the Rust tokenizer (which spreads a batch over threads)

# Where the text may be cut into separately tokenised pieces without changing the tokens: after a line break that
# sits between two non-space characters, or that is followed by one whitespace character and then a non-space one.
# GPT-2's pre-tokenizer regex splits there anyway (a whitespace run followed by a word is split before its last
# character), and BERT's splits at every whitespace. "Whitespace" is Unicode's White_Space, as in the Rust regex.
_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_SAFE_CUT = re.compile(f"(?<=[^{_WHITESPACE}]\n)(?=[^{_WHITESPACE}])|(?<=\n)(?=[{_WHITESPACE}][^{_WHITESPACE}])")


class TextDataModule(LightningDataModule):
    r"""Causal language modelling: text tokenised into one stream per split and packed into fixed-length blocks.

    Source: with ``train_files``, local UTF-8 text files (read with universal newlines, so line ends become
    ``"\n"``); a split's text is the concatenation of its files. ``val_files`` give the validation text; without
    them the last ``val_fraction`` of the tokenised training stream becomes validation (as nanoGPT does), and the
    training split is what comes before. Without ``train_files``, the Hugging Face dataset ``dataset`` /
    ``dataset_config`` (default Wikitext-103, raw) via ``datasets.load_dataset``, its ``"text"`` column, splits
    ``train``, ``validation`` (else the last ``val_fraction`` of train) and ``test`` (optional); an unreachable Hub
    raises ``ConnectionError`` within seconds. A split's text is its rows in order, each followed by ``"\n"``
    unless it is empty or already ends with one: Wikitext's rows are lines that keep their ``"\n"`` and blank
    lines are empty rows, so the text is the article text without blank lines, and it is tokenised row by row as
    Hugging Face's ``run_clm`` example does (see below).

    Tokenisation: the text of a split is cut into pieces after line breaks where GPT-2-style byte-level and
    BERT-style pre-tokenizers split anyway (a line break between two non-space characters, or one followed by
    exactly one whitespace character and then a non-space one); the pieces are encoded in batches without special
    tokens and their ids concatenated. For those tokenizers (including ``byte``, ``bpe:<n>``, ``wordpiece:<n>``
    and GPT-2's) the stream equals encoding the whole text at once; tokenizers that mark word starts
    (SentencePiece) treat each piece as a new text. No separator is inserted between files or rows.

    Tokenizer (``tokenizer``): see :func:`layerwise.datamodules.tokenizers.load_tokenizer`: ``"byte"`` (256 bytes +
    ``<|endoftext|>``), ``"bpe:<vocab_size>"`` / ``"wordpiece:<vocab_size>"`` trained on the whole training text
    (with ``val_fraction`` that includes the held-out tail), or a Hub name / local folder (default ``"gpt2"``, which
    needs the Hub or its cache). Trained tokenizers are trained in ``prepare_data`` and cached in ``tokenizer_dir``
    (default: ``<folder of the first training file>/tokenizers`` when writable, else
    ``~/.cache/layerwise/tokenizers``), keyed by the training files' paths, sizes and modification times, or by the
    dataset name, config and training row count.

    Blocks: each split's stream is cut into consecutive non-overlapping blocks of ``block_size`` tokens; the
    remainder shorter than a block is dropped; ``max_train_blocks`` / ``max_val_blocks`` keep the first blocks of
    the training / evaluation splits. Each split is held as one int32 tensor ``(num_blocks, block_size)``
    (``train_blocks``, ``val_blocks``, ``test_blocks``), so memory is the size of the token stream.

    Batches: dicts with ``input_ids`` int64 ``(B, block_size)`` and ``attention_mask`` int64 ``(B, block_size)`` of
    ones. There is no ``labels`` key: the model predicts token ``t + 1`` from positions ``<= t`` by shifting.
    ``train_dataloader`` shuffles; ``val_dataloader`` and ``predict_dataloader`` return validation in order;
    ``test_dataloader`` returns the test split when the source has one, else validation.

    Attributes (after ``setup``, or ``load_tokenizer()`` for the tokenizer): ``tokenizer``, ``vocab_size``
    (``len(tokenizer)``, special tokens included) and :meth:`class_counts`.

    Args:
        dataset: Hugging Face dataset id (or a local dataset folder) used when ``train_files`` is None.
        dataset_config: its configuration name, e.g. ``"wikitext-103-raw-v1"``; None for datasets without one.
        train_files: local UTF-8 text files for training; take priority over ``dataset``.
        val_files: local UTF-8 text files for validation (needs ``train_files``).
        val_fraction: fraction in (0, 1) of the training stream held out when there is no validation text.
        tokenizer: tokenizer spec (see above).
        tokenizer_dir: cache folder for trained tokenizers (see above).
        block_size: tokens per block (sequence length T).
        batch_size: blocks per batch.
        num_workers: DataLoader worker processes.
        max_train_blocks: keep only the first blocks of the training split (None keeps all).
        max_val_blocks: keep only the first blocks of the validation and test splits (None keeps all).
    """

    @property
    def test_split(self) -> str:
        """The split ``test_dataloader`` serves: ``test`` when the source has one, else ``validation``."""
        return "test" if getattr(self, "test_blocks", None) is not None else "validation"

    def __init__(
        self,
        dataset: Optional[str] = "Salesforce/wikitext",
        dataset_config: Optional[str] = "wikitext-103-raw-v1",
        train_files: Optional[list[str]] = None,
        val_files: Optional[list[str]] = None,
        val_fraction: float = 0.1,
        tokenizer: str = "gpt2",
        tokenizer_dir: Optional[str] = None,
        block_size: int = 256,
        batch_size: int = 8,
        num_workers: int = 0,
        max_train_blocks: Optional[int] = None,
        max_val_blocks: Optional[int] = None,
    ) -> None:
        super().__init__()
        check_positive_int("block_size", block_size)
        check_positive_int("batch_size", batch_size)
        check_positive_int("num_workers", num_workers, minimum=0)
        for name, value in (("max_train_blocks", max_train_blocks), ("max_val_blocks", max_val_blocks)):
            if value is not None:
                check_positive_int(name, value)
        if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
            raise UsageError(f"{flag('val_fraction')} must lie in (0, 1), got {val_fraction!r}")
        parse_spec(tokenizer, flag("tokenizer"))
        if val_files is not None and train_files is None:
            raise UsageError(f"{flag('val_files')} needs {flag('train_files')} too (local files or neither)")
        self.train_files = _check_files("train_files", train_files)
        self.val_files = _check_files("val_files", val_files)
        if self.train_files is None and not dataset:
            raise UsageError(f"Pass {flag('train_files')}=[...] (local text files) or {flag('dataset')}=<hub id>")
        self.dataset = dataset
        self.dataset_config = dataset_config
        self.val_fraction = float(val_fraction)
        self.tokenizer_spec = tokenizer
        self.tokenizer_dir = _tokenizer_dir(tokenizer_dir, self.train_files)
        self.block_size = block_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.max_train_blocks = max_train_blocks
        self.max_val_blocks = max_val_blocks
        self.tokenizer: Optional[PreTrainedTokenizerFast] = None
        self.train_blocks: Optional[Tensor] = None
        self.val_blocks: Optional[Tensor] = None
        self.test_blocks: Optional[Tensor] = None

    # ----------------------------------------------------------------------------------------------------------
    # Tokenizer and vocabulary

    def load_tokenizer(self) -> PreTrainedTokenizerFast:
        """Load (training and caching it first if needed) the tokenizer, set ``self.tokenizer`` and return it."""
        if self.tokenizer is not None:
            return self.tokenizer
        if parse_spec(self.tokenizer_spec)[0] not in TRAINED_KINDS:  # nothing to train: no need to read the data
            self.tokenizer = load_tokenizer(self.tokenizer_spec, option=flag("tokenizer"))
            return self.tokenizer
        if self.train_files is not None:
            files = self.train_files
            corpus_key = "files:" + json.dumps([_file_identity(path) for path in files])

            def corpus() -> Iterator[str]:
                return _pieces(_file_chunks(files, "train_files"))

        else:
            train = self._hub_split(self._load_hub_dataset(), "train")
            corpus_key = f"hub:{self.dataset}:{self.dataset_config}:{train.num_rows}"

            def corpus() -> Iterator[str]:
                return _pieces(_row_chunks(train))

        self.tokenizer = load_tokenizer(
            self.tokenizer_spec,
            corpus=corpus,
            cache_dir=self.tokenizer_dir,
            option=flag("tokenizer"),
            corpus_key=corpus_key,
        )
        return self.tokenizer

    @property
    def vocab_size(self) -> int:
        """Number of token ids, special tokens included (``len(tokenizer)``); needs the tokenizer loaded."""
        if self.tokenizer is None:
            raise RuntimeError(
                f"{type(self).__name__}.vocab_size needs the tokenizer: call prepare_data() and setup(), or "
                "load_tokenizer(), first"
            )
        return len(self.tokenizer)

    def class_counts(self) -> Tensor:
        """How often each token id occurs in the training blocks: float64 ``(vocab_size,)``, summing to their size."""
        if self.train_blocks is None:
            raise RuntimeError(f"{type(self).__name__}.class_counts needs the training split: call setup('fit') first")
        return torch.bincount(self.train_blocks.flatten(), minlength=self.vocab_size).to(torch.float64)

    # ----------------------------------------------------------------------------------------------------------
    # Lightning hooks

    def prepare_data(self) -> None:
        """Download the Hub dataset (without ``train_files``) and train the tokenizer if it is not cached."""
        if self.train_files is None:
            self._load_hub_dataset()
        self.load_tokenizer()

    def setup(self, stage: Optional[str] = None) -> None:
        """Tokenise and pack the splits: validation and test always, training for ``fit`` (idempotent)."""
        need_train = stage in (None, "fit")
        if self.val_blocks is not None and (self.train_blocks is not None or not need_train):
            return
        tokenizer = self.load_tokenizer()
        if self.block_size > tokenizer.model_max_length:
            rank_zero_warn(
                f"{flag('block_size')}={self.block_size} exceeds the {tokenizer.model_max_length} positions the "
                f"tokenizer {self.tokenizer_spec!r} was made for; a pretrained model with that limit cannot take it",
                category=LayerwiseWarning,
            )
        if self.train_files is not None:
            train, val, test = self._local_streams(tokenizer)
        else:
            train, val, test = self._hub_streams(tokenizer, need_train)
        if need_train:
            assert train is not None
            self.train_blocks = self._blocks(train, "training", self.max_train_blocks)
        self.val_blocks = self._blocks(val, "validation", self.max_val_blocks)
        self.test_blocks = None if test is None else self._blocks(test, "test", self.max_val_blocks)

    def train_dataloader(self) -> DataLoader:
        """Training blocks, shuffled."""
        return self._loader(self.train_blocks, "training", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        """Validation blocks, in order."""
        return self._loader(self.val_blocks, "validation", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        """Test blocks in order when the source has a test split, else the validation blocks."""
        if self.test_blocks is not None:
            return self._loader(self.test_blocks, "test", shuffle=False)
        return self._loader(self.val_blocks, "validation", shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        """Validation blocks, in order."""
        return self._loader(self.val_blocks, "validation", shuffle=False)

    # ----------------------------------------------------------------------------------------------------------
    # Internals

    def _local_streams(self, tokenizer: PreTrainedTokenizerFast) -> tuple[Tensor, Tensor, None]:
        """Token streams of the local files: (train, validation, no test)."""
        assert self.train_files is not None
        stream = _encode(tokenizer, _pieces(_file_chunks(self.train_files, "train_files")))
        if self.val_files is not None:
            return stream, _encode(tokenizer, _pieces(_file_chunks(self.val_files, "val_files"))), None
        train, val = self._hold_out(stream, flag("train_files"))
        return train, val, None

    def _hub_streams(
        self, tokenizer: PreTrainedTokenizerFast, need_train: bool
    ) -> tuple[Optional[Tensor], Tensor, Optional[Tensor]]:
        """Token streams of the Hub splits: (train or None when not needed, validation, test or None)."""
        splits = self._load_hub_dataset()

        def encode(split: str) -> Tensor:
            return _encode(tokenizer, _pieces(_row_chunks(self._hub_split(splits, split))))

        test = encode("test") if "test" in splits else None
        if "validation" in splits:
            return (encode("train") if need_train else None), encode("validation"), test
        train, val = self._hold_out(encode("train"), flag("dataset"))
        return train, val, test

    def _hold_out(self, stream: Tensor, source: str) -> tuple[Tensor, Tensor]:
        """Split ``stream`` into its first and its last ``val_fraction`` (nanoGPT: ``n_train = int(n * (1 - f))``)."""
        if len(stream) == 0:  # a model folder without tokenizer files can give a tokenizer that encodes nothing
            raise UsageError(
                f"{source}: 0 tokens: the text is empty, or its tokenizer encodes it to nothing (give "
                f"{flag('tokenizer')}, e.g. byte)"
            )
        n_train = int(len(stream) * (1 - self.val_fraction))
        if n_train == 0 or n_train == len(stream):
            raise UsageError(
                f"{source}: {len(stream)} tokens cannot be split by {flag('val_fraction')}={self.val_fraction}"
            )
        return stream[:n_train], stream[n_train:]

    def _blocks(self, stream: Tensor, split: str, max_blocks: Optional[int]) -> Tensor:
        """Consecutive ``block_size`` blocks of ``stream`` (remainder dropped, at most ``max_blocks``)."""
        num_blocks = len(stream) // self.block_size
        if num_blocks == 0:
            raise UsageError(
                f"The {split} split has {len(stream)} tokens, fewer than {flag('block_size')}={self.block_size}"
            )
        if max_blocks is not None and max_blocks < num_blocks:
            # A copy, so the rest of the stream can be freed.
            return stream[: max_blocks * self.block_size].clone().view(max_blocks, self.block_size)
        return stream[: num_blocks * self.block_size].view(num_blocks, self.block_size)

    def _loader(self, blocks: Optional[Tensor], split: str, shuffle: bool) -> DataLoader:
        if blocks is None:
            raise RuntimeError(f"{type(self).__name__}: the {split} split is not built; call setup() first")
        return split_loader(_BlockDataset(blocks), self.batch_size, self.num_workers, shuffle)

    def _load_hub_dataset(self) -> Any:
        """``datasets.load_dataset(dataset, dataset_config)``, failing at once with a message naming the flags."""
        import datasets

        assert self.dataset is not None
        name = f"{flag('dataset')}={self.dataset} ({flag('dataset_config')}={self.dataset_config})"
        instead = f"Pass {flag('train_files')}=[/path/to/train.txt] to read local text files instead"
        if not Path(self.dataset).expanduser().exists():
            hub.check_reachable(name, instead)
        try:
            return datasets.load_dataset(self.dataset, self.dataset_config)
        except ConnectionError as err:
            raise hub.HubUnreachable(
                f"Could not load {name} from the Hub or its local cache ({err}). {instead}."
            ) from err
        except FileNotFoundError as err:  # includes datasets' DatasetNotFoundError (missing or gated repository)
            raise FileNotFoundError(f"{name} was not found or is not accessible ({err}). {instead}.") from err

    def _hub_split(self, splits: Any, split: str) -> Any:
        """Split ``split`` of the loaded dataset, checked to have a ``"text"`` column."""
        if split not in splits:
            raise UsageError(f"{flag('dataset')}={self.dataset} has no '{split}' split (found {sorted(splits)})")
        dataset = splits[split]
        if TEXT_COLUMN not in dataset.column_names:
            raise UsageError(
                f"{flag('dataset')}={self.dataset} split '{split}' has no '{TEXT_COLUMN}' column "
                f"(found {dataset.column_names})"
            )
        return dataset


class _BlockDataset(Dataset):
    """Rows of an int ``(N, T)`` tensor as ``{"input_ids": int64 (T,), "attention_mask": int64 ones (T,)}``."""

    def __init__(self, blocks: Tensor) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        input_ids = self.blocks[index].long()
        return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


def _check_files(arg: str, files: Optional[list[str]]) -> Optional[list[Path]]:
    """Resolve ``files`` to absolute paths, raising naming ``--data.init_args.<arg>`` unless all are files."""
    if files is None:
        return None
    if isinstance(files, (str, Path)) or not files:
        raise UsageError(f"{flag(arg)} must be a non-empty list of text files, got {files!r}")
    paths = [Path(file).expanduser().resolve() for file in files]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"{flag(arg)}: no such file(s) {missing}")
    return paths


def _tokenizer_dir(tokenizer_dir: Optional[str], train_files: Optional[list[Path]]) -> Path:
    """``tokenizer_dir``, else ``<folder of the first training file>/tokenizers`` if writable, else the user cache."""
    if tokenizer_dir is not None:
        return Path(tokenizer_dir).expanduser().resolve()
    if train_files is not None and os.access(train_files[0].parent, os.W_OK):
        return train_files[0].parent / "tokenizers"
    return Path(USER_TOKENIZER_CACHE).expanduser()


def _file_identity(path: Path) -> tuple[str, int, int]:
    """``(path, size, mtime_ns)``: what identifies a file's content in the tokenizer cache key."""
    stat = path.stat()
    return str(path), stat.st_size, stat.st_mtime_ns


def _file_chunks(files: list[Path], arg: str) -> Iterator[str]:
    """The text of ``files``, one after the other, in chunks of ``READ_CHARS`` characters."""
    for path in files:
        try:
            with open(path, encoding="utf-8") as handle:
                yield from iter(lambda handle=handle: handle.read(READ_CHARS), "")
        except UnicodeDecodeError as err:
            raise UsageError(f"{flag(arg)}: {str(path)!r} is not UTF-8 text ({err})") from err


def _row_chunks(dataset: Any) -> Iterator[str]:
    r"""The ``"text"`` rows of a dataset, each followed by ``"\n"`` unless empty or already ending with one."""
    for batch in dataset.select_columns([TEXT_COLUMN]).iter(batch_size=ROWS_PER_CHUNK):
        yield "".join(row if not row or row.endswith("\n") else row + "\n" for row in batch[TEXT_COLUMN])


def _pieces(chunks: Iterable[str]) -> Iterator[str]:
    """Cut the concatenation of ``chunks`` at the ``_SAFE_CUT`` places.

    The text after the last cut of a chunk is carried into the next, since a cut at its end depends on what follows;
    only the carry's last character is searched again.
    """
    carry = ""
    for chunk in chunks:
        text = carry + chunk
        start = 0
        for match in _SAFE_CUT.finditer(text, max(0, len(carry) - 1)):
            yield text[start : match.start()]
            start = match.start()
        carry = text[start:]
    if carry:
        yield carry


def _encode(tokenizer: PreTrainedTokenizerFast, pieces: Iterable[str]) -> Tensor:
    """Token ids of the ``pieces``, concatenated into one int32 tensor (no special tokens)."""
    backend = tokenizer.backend_tokenizer  # the Rust tokenizer: what ``tokenizer(...)`` calls, minus Python overhead
    parts = [np.zeros(0, dtype=np.int32)]
    iterator = iter(pieces)
    while batch := list(itertools.islice(iterator, PIECES_PER_CALL)):
        encodings = backend.encode_batch_fast(batch, add_special_tokens=False)
        ids = itertools.chain.from_iterable(encoding.ids for encoding in encodings)
        parts.append(np.fromiter(ids, dtype=np.int32))
    return torch.from_numpy(np.concatenate(parts))
