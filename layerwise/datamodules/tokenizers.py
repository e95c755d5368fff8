"""Tokenizers for the text datamodules: byte-level, trained offline on the corpus, or pretrained from the Hub.

``load_tokenizer(spec, ...)`` turns one string, the ``--data.init_args.tokenizer`` flag, into a
``transformers.PreTrainedTokenizerFast``:

- ``"byte"``: the 256 byte values are the tokens (token id = byte value), plus ``<|endoftext|>`` (id 256) used as
  eos, bos and pad. Nothing to train or download; decoding round-trips any UTF-8 text exactly.
- ``"bpe:<vocab_size>"``: GPT-2-style byte-level BPE trained on the corpus (the 256 byte symbols are always in the
  vocabulary, so every text is encodable and decodes back exactly); ``<|endoftext|>`` (id 0) is eos, bos and pad.
- ``"wordpiece:<vocab_size>"``: BERT-style lower-cased WordPiece trained on the corpus, with ``[PAD]`` ``[UNK]``
  ``[CLS]`` ``[SEP]`` ``[MASK]`` (ids 0-4); encoding adds ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` with
  ``token_type_ids`` 0 for the first segment and 1 for the second, as ``bert-base-uncased`` does.
- anything else: a Hub name or a local folder for ``transformers.AutoTokenizer.from_pretrained``.

Trained tokenizers are deterministic (the same corpus gives the same vocabulary) and, when ``cache_dir`` is given,
saved there once and reloaded on every later call, so under DDP rank 0 can train in ``prepare_data`` and every rank
loads the same files in ``setup``. Every returned tokenizer has a pad token.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Optional, Union

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from layerwise import hub
from layerwise.results import write_folder_atomic

TOKENIZER_FLAG = "--data.init_args.tokenizer"
END_OF_TEXT = "<|endoftext|>"
# BERT's special tokens by their role in transformers' tokenizers, in the order of their ids
WORDPIECE_SPECIAL_TOKENS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}
WORDPIECE_SPECIALS = tuple(WORDPIECE_SPECIAL_TOKENS.values())
NUM_BYTES = 256
RECIPE_VERSION = "1"  # part of the cache key: bump it when a training recipe changes, so old caches are not reused
WORDPIECE_ALPHABET = 1000  # characters kept by the WordPiece trainer, as BERT
TRAINED_KINDS = ("bpe", "wordpiece")
OFFLINE_SPECS = "'byte', 'bpe:<vocab_size>' or 'wordpiece:<vocab_size>'"


def parse_spec(spec: str, option: str = TOKENIZER_FLAG) -> tuple[str, Optional[int]]:
    """Split a tokenizer spec into ``(kind, vocab_size)``.

    Args:
        spec: ``"byte"``, ``"bpe:<vocab_size>"``, ``"wordpiece:<vocab_size>"`` or a Hub name / local path.
        option: the CLI flag named in errors.

    Returns:
        ``("byte", None)``, ``("bpe", n)``, ``("wordpiece", n)`` or ``("pretrained", None)``.

    Raises:
        ValueError: the spec is empty, or starts with ``byte``/``bpe``/``wordpiece`` but is malformed, e.g.
            ``"bpe:abc"``, ``"bpe:0"``, ``"bpe"`` or ``"byte:3"``.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{option} must be a non-empty string ({OFFLINE_SPECS}, or a Hub name), got {spec!r}")
    kind, _, size = spec.partition(":")
    if kind == "byte":
        if spec != "byte":
            raise ValueError(f"{option}={spec!r}: the byte-level tokenizer takes no argument; write 'byte'")
        return "byte", None
    if kind not in TRAINED_KINDS:
        return "pretrained", None
    minimum = NUM_BYTES + 1 if kind == "bpe" else len(WORDPIECE_SPECIALS) + 1
    if not size.isdigit() or int(size) < minimum:
        raise ValueError(
            f"{option}={spec!r} is not a valid spec: write '{kind}:<vocab_size>' with an integer vocab_size >= "
            f"{minimum}, e.g. '{kind}:8192'"
        )
    return kind, int(size)


def load_tokenizer(
    spec: str,
    corpus: Optional[Callable[[], Iterable[str]]] = None,
    cache_dir: Optional[Union[str, Path]] = None,
    option: str = TOKENIZER_FLAG,
    corpus_key: Optional[str] = None,
) -> PreTrainedTokenizerFast:
    """Build, train, reload or download the tokenizer named by ``spec`` (see the module docstring for the forms).

    Args:
        spec: ``"byte"``, ``"bpe:<vocab_size>"``, ``"wordpiece:<vocab_size>"``, or a Hub name / local folder.
        corpus: for ``bpe``/``wordpiece``, a function returning a fresh iterable of training texts (documents or
            lines; each is pre-tokenized on its own). Only called when the tokenizer is not cached yet.
        cache_dir: folder for trained tokenizers. A trained tokenizer is stored in
            ``cache_dir/<kind>-<vocab_size>-<hash>``, the hash covering the recipe version, the spec and the corpus
            identity, and reloaded from there on later calls without touching ``corpus``. The folder is written
            under a temporary name and renamed when complete, so a reader never sees a half-written tokenizer.
            None trains in memory every time.
        option: the CLI flag named in errors.
        corpus_key: a string identifying the corpus (e.g. file paths with sizes and mtimes, or a dataset name and
            revision). None hashes the text returned by ``corpus`` instead, which reads the corpus on every call.

    Returns:
        A fast tokenizer with a pad token (Hub tokenizers without one, like GPT-2's, use their eos token as pad).

    Raises:
        ValueError: malformed spec (naming ``option``), a trained spec with neither a cached copy nor a ``corpus``,
            or a Hub tokenizer that cannot be loaded (e.g. offline; the message suggests the offline specs).
    """
    kind, vocab_size = parse_spec(spec, option)
    if kind == "byte":
        return byte_tokenizer()
    if kind == "pretrained":
        return _pretrained_tokenizer(spec, option)
    assert vocab_size is not None
    if cache_dir is None:
        return _train(kind, vocab_size, _require_corpus(corpus, spec, option))
    folder = Path(cache_dir).expanduser() / f"{kind}-{vocab_size}-{_cache_hash(spec, corpus, corpus_key, option)}"
    if not folder.is_dir():
        _save_atomically(_train(kind, vocab_size, _require_corpus(corpus, spec, option)), folder)
    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """The byte-level tokenizer: token id ``b`` is byte ``b`` (0-255) and id 256 is ``<|endoftext|>``.

    A byte-level BPE without merges: the ``ByteLevel`` pre-tokenizer maps every byte to one printable symbol (GPT-2's
    table), the vocabulary holds those 256 symbols, and the ``ByteLevel`` decoder maps them back to bytes.
    """
    symbols = _gpt2_byte_symbols()
    vocab = {symbols[byte]: byte for byte in range(NUM_BYTES)}
    vocab[END_OF_TEXT] = NUM_BYTES
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    return _byte_level_wrapper(backend)


def _gpt2_byte_symbols() -> list[str]:
    """GPT-2's byte -> printable unicode symbol table (``bytes_to_unicode``), indexed by byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols = {byte: chr(byte) for byte in printable}
    others = [byte for byte in range(NUM_BYTES) if byte not in symbols]
    symbols.update({byte: chr(NUM_BYTES + i) for i, byte in enumerate(others)})
    return [symbols[byte] for byte in range(NUM_BYTES)]


def _byte_level_wrapper(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """Give a byte-level BPE backend GPT-2's pre-tokenizer/decoder and wrap it with ``<|endoftext|>`` as eos/pad."""
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    backend.add_special_tokens([END_OF_TEXT])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        model_input_names=["input_ids", "attention_mask"],
        clean_up_tokenization_spaces=False,  # keep " ," and " ." as written: decoding must round-trip exactly
    )


def _require_corpus(
    corpus: Optional[Callable[[], Iterable[str]]], spec: str, option: str
) -> Callable[[], Iterable[str]]:
    """``corpus``, or a ValueError saying a trained tokenizer needs one."""
    if corpus is None:
        raise ValueError(f"{option}={spec!r} trains a tokenizer and needs a training corpus, but none was given")
    return corpus


def _cache_hash(
    spec: str, corpus: Optional[Callable[[], Iterable[str]]], corpus_key: Optional[str], option: str
) -> str:
    """16 hex digits of SHA-256 over the recipe version, the spec and the corpus identity."""
    digest = hashlib.sha256(f"layerwise-tokenizer-v{RECIPE_VERSION}\0{spec}\0".encode())
    if corpus_key is not None:
        digest.update(b"key\0" + corpus_key.encode())
    else:
        digest.update(b"text\0")
        for text in _require_corpus(corpus, spec, option)():
            digest.update(text.encode() + b"\0")
    return digest.hexdigest()[:16]


def _train(kind: str, vocab_size: int, corpus: Callable[[], Iterable[str]]) -> PreTrainedTokenizerFast:
    """Train a ``bpe`` or ``wordpiece`` tokenizer with ``vocab_size`` entries on ``corpus()``."""
    return _train_bpe(vocab_size, corpus) if kind == "bpe" else _train_wordpiece(vocab_size, corpus)


def _train_bpe(vocab_size: int, corpus: Callable[[], Iterable[str]]) -> PreTrainedTokenizerFast:
    """Byte-level BPE; deterministic because every symbol (the 256 bytes) has a fixed id before training starts."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, even those absent from the corpus
        show_progress=False,
    )
    backend.train_from_iterator(corpus(), trainer=trainer)
    return _byte_level_wrapper(backend)


def _train_wordpiece(vocab_size: int, corpus: Callable[[], Iterable[str]]) -> PreTrainedTokenizerFast:
    """BERT-style WordPiece: lower-cased, accents stripped, ``[CLS] a [SEP] b [SEP]`` with token type ids.

    The ``tokenizers`` trainer numbers the continuation symbols ``##c`` in hash-map order, and merges with tied
    counts are then broken by those numbers, so two trainings can differ. To make training deterministic we fix the
    alphabet first (the ``WORDPIECE_ALPHABET`` most frequent characters, ties broken by code point, as BERT keeps
    1000) and reserve every ``##c`` as a training-time special token, so all symbols have fixed ids; the final model
    is rebuilt from the trained vocabulary with only the five BERT special tokens.
    """
    normalizer = normalizers.BertNormalizer(lowercase=True)  # also strips accents, as bert-base-uncased
    alphabet = _frequent_characters(normalizer, corpus, WORDPIECE_ALPHABET)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=[*WORDPIECE_SPECIALS, *(f"##{char}" for char in alphabet)],
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        continuing_subword_prefix="##",
        show_progress=False,
    )
    trained = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    trained.normalizer = normalizer
    trained.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trained.train_from_iterator(corpus(), trainer=trainer)

    backend = Tokenizer(models.WordPiece(trained.get_vocab(), unk_token="[UNK]", continuing_subword_prefix="##"))
    backend.normalizer = normalizer
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    backend.add_special_tokens(list(WORDPIECE_SPECIALS))
    cls, sep = WORDPIECE_SPECIAL_TOKENS["cls_token"], WORDPIECE_SPECIAL_TOKENS["sep_token"]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, backend.token_to_id(cls)), (sep, backend.token_to_id(sep))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        **WORDPIECE_SPECIAL_TOKENS,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def _frequent_characters(
    normalizer: normalizers.Normalizer, corpus: Callable[[], Iterable[str]], limit: int
) -> list[str]:
    """The ``limit`` most frequent non-space characters of the normalised corpus, ties broken by code point."""
    counts: Counter[str] = Counter()
    for text in corpus():
        counts.update(normalizer.normalize_str(text))
    ranked = sorted((char for char in counts if not char.isspace()), key=lambda char: (-counts[char], char))
    return sorted(ranked[:limit])


def _save_atomically(tokenizer: PreTrainedTokenizerFast, folder: Path) -> None:
    """Save through the one atomic folder writer; if another process saved the same tokenizer first, keep theirs."""

    def save(staging: Path) -> None:
        staging.mkdir()
        tokenizer.save_pretrained(str(staging))

    write_folder_atomic(folder, save, keep_existing=True)


def _pretrained_tokenizer(spec: str, option: str) -> PreTrainedTokenizerFast:
    """``AutoTokenizer.from_pretrained(spec)``: local folder, else the Hugging Face cache, else the Hub."""
    from transformers import AutoTokenizer

    from layerwise.hub import legacy_config

    legacy = legacy_config(spec)  # a TransformerLens checkpoint names its tokenizer in its config
    if legacy is not None and legacy.get("tokenizer_name"):
        spec = str(legacy["tokenizer_name"])
    instead = f"Offline, pass {option}=byte, or {option}=bpe:<vocab_size> or wordpiece:<vocab_size> to train one"
    if Path(spec).expanduser().exists():
        tokenizer = _wrap_errors(lambda: AutoTokenizer.from_pretrained(str(Path(spec).expanduser())), spec, option)
        if getattr(tokenizer, "vocab_size", None) == 0:  # a model folder without tokenizer files: transformers
            raise ValueError(  # builds an empty tokenizer from its config, which encodes every text to nothing
                f"{option}={spec!r} holds no tokenizer (no vocabulary in the folder); "
                f"give {option}=byte, bpe:<vocab_size> or wordpiece:<vocab_size>, or the folder of the models' own."
            )
        return _with_pad_token(tokenizer, spec, option)
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec, local_files_only=True)
    except Exception:  # not in the Hugging Face cache (the exception type varies across versions): try the Hub
        if hub.hub_offline():
            raise ValueError(
                f"{option}={spec!r} is neither a local folder nor in the Hugging Face cache, and offline mode is on "
                f"(HF_HUB_OFFLINE). {instead}."
            ) from None
        endpoint = hub.hub_endpoint()
        reason = hub.hub_unreachable_reason(endpoint)
        if reason is not None:
            raise ValueError(
                f"{option}={spec!r} is neither a local folder nor in the Hugging Face cache, and the Hub at "
                f"{endpoint} cannot be reached ({reason}). {instead}."
            ) from None
        tokenizer = _wrap_errors(lambda: AutoTokenizer.from_pretrained(spec), spec, option)
    return _with_pad_token(tokenizer, spec, option)


def _wrap_errors(load: Callable[[], object], spec: str, option: str) -> object:
    """Run ``load``, turning its failure into a ValueError naming ``option``."""
    try:
        return load()
    except Exception as err:  # transformers raises OSError, ValueError or hub errors depending on the cause
        raise ValueError(
            f"{option}={spec!r} could not be loaded with transformers.AutoTokenizer ({type(err).__name__}: {err}). "
            f"Offline, set {option} to {OFFLINE_SPECS}."
        ) from err


def _with_pad_token(tokenizer: object, spec: str, option: str) -> PreTrainedTokenizerFast:
    """Check ``tokenizer`` is fast and give it a pad token (its eos token, as is usual for GPT-2)."""
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise ValueError(f"{option}={spec!r} has no fast (Rust) tokenizer; got {type(tokenizer).__name__}")
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"{option}={spec!r} has neither a pad nor an eos token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
