"""Tokenizers (byte, trained BPE/WordPiece, pretrained) and the causal-LM TextDataModule, all offline."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path

import datasets
import pytest
import torch
from torch.utils.data import RandomSampler, SequentialSampler

from layerwise import hub
from layerwise.datamodules import TextDataModule
from layerwise.datamodules import text as text_module
from layerwise.datamodules import tokenizers as tok_module
from layerwise.datamodules.tokenizers import byte_tokenizer, load_tokenizer
from layerwise.errors import UsageError

FLAG = "--data.init_args"
SHAKESPEARE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "tinyshakespeare" / "input.txt"

CORPUS = [
    "The quick brown fox jumps over the lazy dog.\n",
    "Über café naïve façade — déjà vu, 東京 and 🤗 emoji!\n",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.\n",
    "Hello there, general Kenobi. The high ground is mine; the quick fox agrees.\n",
] * 20
SAMPLE = "Héllo  wörld ,  . 日本語 🤗\n\t\x00 end \r\n ÿ\x7f trailing  "


def corpus():
    return iter(CORPUS)


def must_not_be_called():
    raise AssertionError("the corpus must not be read: the tokenizer is cached")


def random_unicode(rng: random.Random, length: int) -> str:
    """Random text mixing ASCII, whitespace, Latin-1, CJK, emoji and control characters."""
    pools = ["abcXYZ019", " \n\t\r", "éüßñøÿ", "日本語中文", "🤗🚀𝔘", "\x00\x1c\x7f\u200b"]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(length))


# -------------------------------------------------------------------------------------------------- tokenizers


def test_byte_tokenizer_is_bytes_plus_endoftext_and_round_trips_utf8():
    tokenizer = load_tokenizer("byte")
    assert len(tokenizer) == 257 and tokenizer.vocab_size == 257
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 256
    rng = random.Random(0)
    for text in [SAMPLE, *(random_unicode(rng, rng.randint(1, 60)) for _ in range(200))]:
        ids = tokenizer(text)["input_ids"]
        assert ids == list(text.encode("utf-8"))  # token id = byte value, no special tokens added
        assert tokenizer.decode(ids) == text
    ids = tokenizer("a<|endoftext|>b")["input_ids"]
    assert ids == [97, 256, 98] and tokenizer.decode(ids) == "a<|endoftext|>b"


@pytest.mark.parametrize("spec", ["bpe:300", "wordpiece:120"])
def test_trained_tokenizers_are_deterministic(tmp_path, spec):
    first = load_tokenizer(spec, corpus=corpus, cache_dir=tmp_path / "a", corpus_key="k")
    second = load_tokenizer(spec, corpus=corpus, cache_dir=tmp_path / "b", corpus_key="k")
    in_memory = load_tokenizer(spec, corpus=corpus)
    assert len(first) == int(spec.split(":")[1])
    assert first.get_vocab() == second.get_vocab() == in_memory.get_vocab()
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()
    (a,) = (tmp_path / "a").iterdir()
    (b,) = (tmp_path / "b").iterdir()
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("spec", ["bpe:300", "wordpiece:120"])
def test_cached_tokenizer_reloads_identically_without_training(tmp_path, spec):
    trained = load_tokenizer(spec, corpus=corpus, cache_dir=tmp_path, corpus_key="k")
    (folder,) = tmp_path.iterdir()  # one complete folder, no temporary leftovers
    assert folder.name.startswith(spec.replace(":", "-") + "-")
    stamps = {path.name: path.stat().st_mtime_ns for path in folder.iterdir()}
    reloaded = load_tokenizer(spec, corpus=must_not_be_called, cache_dir=tmp_path, corpus_key="k")
    assert reloaded.backend_tokenizer.to_str() == trained.backend_tokenizer.to_str()
    assert reloaded.get_vocab() == trained.get_vocab()
    assert (reloaded.pad_token, reloaded.eos_token, reloaded.model_input_names) == (
        trained.pad_token,
        trained.eos_token,
        trained.model_input_names,
    )
    assert reloaded(SAMPLE) == trained(SAMPLE)
    assert {path.name: path.stat().st_mtime_ns for path in folder.iterdir()} == stamps
    load_tokenizer(spec, corpus=corpus, cache_dir=tmp_path, corpus_key="other corpus")
    assert len(list(tmp_path.iterdir())) == 2  # another corpus identity, another folder


def test_cache_key_without_corpus_key_hashes_the_text(tmp_path):
    load_tokenizer("bpe:300", corpus=corpus, cache_dir=tmp_path)
    load_tokenizer("bpe:300", corpus=corpus, cache_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 1
    load_tokenizer("bpe:300", corpus=lambda: iter(CORPUS[:40]), cache_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 2


def test_failed_save_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken_save(self, directory, **kwargs):
        (Path(directory) / "tokenizer.json").write_text("{half")
        raise OSError("disk full")

    monkeypatch.setattr(tok_module.PreTrainedTokenizerFast, "save_pretrained", broken_save)
    with pytest.raises(OSError, match="disk full"):
        load_tokenizer("bpe:300", corpus=corpus, cache_dir=tmp_path, corpus_key="k")
    assert list(tmp_path.iterdir()) == []


def test_bpe_round_trips_text_unseen_in_training_and_uses_endoftext():
    tokenizer = load_tokenizer("bpe:300", corpus=corpus)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer("the quick fox")["input_ids"] != list(b"the quick fox")  # merges were learnt
    rng = random.Random(1)
    for text in [SAMPLE, *(random_unicode(rng, rng.randint(1, 60)) for _ in range(100))]:
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_wordpiece_is_bert_style_with_pairs_and_token_types():
    tokenizer = load_tokenizer("wordpiece:120", corpus=corpus)
    assert [tokenizer.convert_ids_to_tokens(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (tokenizer.pad_token, tokenizer.cls_token, tokenizer.sep_token) == ("[PAD]", "[CLS]", "[SEP]")
    encoded = tokenizer("THE Quick fox", "lazy DOG")
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    first, second = tokenizer.tokenize("the quick fox"), tokenizer.tokenize("lazy dog")
    assert tokens == ["[CLS]", *first, "[SEP]", *second, "[SEP]"]
    assert encoded["token_type_ids"] == [0] * (len(first) + 2) + [1] * (len(second) + 1)
    assert "".join(first).replace("##", "") == "thequickfox"  # lower-cased, split into pieces
    assert tokenizer.tokenize("Über café") == tokenizer.tokenize("uber cafe")  # accents stripped
    single = tokenizer("fox")["input_ids"]
    assert single[0] == tokenizer.cls_token_id and single[-1] == tokenizer.sep_token_id


@pytest.mark.parametrize(
    "spec", ["bpe:abc", "bpe:0", "bpe:256", "bpe", "bpe:", "wordpiece:-3", "wordpiece:5", "byte:3"]
)
def test_bad_specs_name_the_option(spec):
    with pytest.raises(ValueError, match="--my.option"):
        load_tokenizer(spec, corpus=corpus, option="--my.option")


def test_trained_spec_without_corpus_names_the_option(tmp_path):
    with pytest.raises(ValueError, match=f"{FLAG}.tokenizer.*corpus"):
        load_tokenizer("bpe:300", cache_dir=tmp_path, corpus_key="k")
    assert list(tmp_path.iterdir()) == []


def test_local_pretrained_tokenizer_gets_eos_as_pad(tmp_path):
    saved = byte_tokenizer()
    saved.pad_token = None  # GPT-2-style: no pad token
    saved.save_pretrained(tmp_path / "gpt2-like")
    tokenizer = load_tokenizer(str(tmp_path / "gpt2-like"))
    assert tokenizer.pad_token == tokenizer.eos_token == "<|endoftext|>"
    assert tokenizer.decode(tokenizer(SAMPLE)["input_ids"]) == SAMPLE


def test_hub_tokenizer_offline_fails_at_once_naming_the_option(monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda url: "ConnectError: no network")
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"--my.option='layerwise-tests/never-cached'.*no network.*--my.option=byte"):
        load_tokenizer("layerwise-tests/never-cached", option="--my.option")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=r"--my.option=.*offline mode.*bpe:<vocab_size>"):
        load_tokenizer("layerwise-tests/never-cached", option="--my.option")
    assert time.perf_counter() - start < 3.0


# ------------------------------------------------------------------------------------- tokenising in pieces


WHITESPACE_SOUP = ["a", "b", "Fox", " ", "  ", "\n", "\n\n", "\t", "é", ".", "'s", "1", "\xa0", "\x1c", "\u3000"]


def whitespace_soup(seed: int, count: int) -> list[str]:
    """Random short texts dense in whitespace runs, the places where cutting text could change tokens."""
    rng = random.Random(seed)
    return ["".join(rng.choice(WHITESPACE_SOUP) for _ in range(rng.randint(1, 25))) for _ in range(count)]


@pytest.mark.parametrize("spec", ["byte", "bpe:400", "wordpiece:120"])
def test_encoding_in_pieces_equals_encoding_the_whole_text(spec):
    # Trained on the same soup, the BPE learns merges of whitespace runs ("\n\n", "  ", " \n", ...), so any cut
    # that changes the pre-tokenization changes the ids.
    tokenizer = load_tokenizer(spec, corpus=lambda: whitespace_soup(seed=3, count=3000))
    if spec.startswith("bpe"):
        assert {"ĊĊ", "ĠĠ", "ĉĊ"} <= set(tokenizer.get_vocab())  # "\n\n", "  ", "\t\n" in GPT-2's byte symbols
    for text in whitespace_soup(seed=2, count=300):
        chunks = [text[i : i + 3] for i in range(0, len(text), 3)]  # cut points straddle chunk ends
        pieces = list(text_module._pieces(chunks))
        assert "".join(pieces) == text
        expected = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
        assert text_module._encode(tokenizer, pieces).tolist() == expected, repr(text)


# ---------------------------------------------------------------------------------------- TextDataModule, local


def write_text(path: Path, lines: int = 120, seed: int = 0) -> str:
    rng = random.Random(seed)
    words = ["the", "fox", "Über", "café", "東京", "🤗", "jumps", "over", "lazy", "dog", ",", "."]
    text = "".join(" ".join(rng.choice(words) for _ in range(rng.randint(0, 9))) + "\n" for _ in range(lines))
    path.write_text(text, encoding="utf-8")
    return text


def test_local_file_blocks_are_the_stream_and_val_is_the_tail(tmp_path):
    text = write_text(tmp_path / "train.txt")
    dm = TextDataModule(
        train_files=[str(tmp_path / "train.txt")], tokenizer="byte", block_size=16, batch_size=4, val_fraction=0.25
    )
    with pytest.raises(RuntimeError, match="load_tokenizer"):
        _ = dm.vocab_size
    dm.prepare_data()
    dm.setup("fit")
    assert dm.vocab_size == 257
    stream = list(text.encode("utf-8"))
    n_train = int(len(stream) * 0.75)
    train, val = stream[:n_train], stream[n_train:]
    assert dm.train_blocks.shape == (n_train // 16, 16) and dm.val_blocks.shape == (len(val) // 16, 16)
    assert dm.train_blocks.flatten().tolist() == train[: n_train // 16 * 16]
    assert dm.val_blocks.flatten().tolist() == val[: len(val) // 16 * 16]
    assert dm.test_blocks is None

    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"input_ids", "attention_mask"}
    for value in batch.values():
        assert value.shape == (4, 16) and value.dtype == torch.int64
    assert torch.equal(batch["attention_mask"], torch.ones(4, 16, dtype=torch.int64))
    assert isinstance(dm.train_dataloader().sampler, RandomSampler)
    for loader in (dm.val_dataloader(), dm.test_dataloader(), dm.predict_dataloader()):
        assert isinstance(loader.sampler, SequentialSampler)
        assert torch.equal(torch.cat([b["input_ids"] for b in loader]), dm.val_blocks.long())

    counts = dm.class_counts()
    assert counts.dtype == torch.float64 and counts.shape == (257,)
    assert counts.sum() == dm.train_blocks.numel()
    expected = Counter(dm.train_blocks.flatten().tolist())
    assert counts.tolist() == [float(expected[i]) for i in range(257)]


def test_val_files_caps_and_load_tokenizer_before_setup(tmp_path):
    train_text = write_text(tmp_path / "a.txt", seed=1) + write_text(tmp_path / "b.txt", seed=2)
    val_text = write_text(tmp_path / "val.txt", seed=3)
    dm = TextDataModule(
        train_files=[str(tmp_path / "a.txt"), str(tmp_path / "b.txt")],
        val_files=[str(tmp_path / "val.txt")],
        tokenizer="byte",
        block_size=8,
        max_train_blocks=5,
        max_val_blocks=3,
    )
    assert len(dm.load_tokenizer()) == dm.vocab_size == 257
    dm.setup("validate")
    assert dm.train_blocks is None and dm.val_blocks.flatten().tolist() == list(val_text.encode())[:24]
    dm.setup("fit")
    assert dm.train_blocks.flatten().tolist() == list(train_text.encode())[:40]  # files concatenated in order


def test_trained_tokenizer_is_trained_in_prepare_data_and_loaded_in_setup(tmp_path, monkeypatch):
    write_text(tmp_path / "train.txt")
    kwargs = dict(
        train_files=[str(tmp_path / "train.txt")],
        tokenizer="bpe:300",
        tokenizer_dir=str(tmp_path / "tok"),
        block_size=8,
    )
    TextDataModule(**kwargs).prepare_data()  # "rank 0"
    (folder,) = (tmp_path / "tok").iterdir()

    def no_training(*args, **kwargs):
        raise AssertionError("setup must load the cached tokenizer, not train again")

    monkeypatch.setattr(tok_module, "_train", no_training)
    dm = TextDataModule(**kwargs)  # "another rank"
    dm.setup("fit")
    assert dm.vocab_size == 300 and list((tmp_path / "tok").iterdir()) == [folder]


def test_default_tokenizer_dir_is_next_to_writable_training_files(tmp_path):
    write_text(tmp_path / "train.txt")
    dm = TextDataModule(train_files=[str(tmp_path / "train.txt")], tokenizer="bpe:300")
    assert dm.tokenizer_dir == tmp_path.resolve() / "tokenizers"


@pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=f"Tiny Shakespeare not found at {SHAKESPEARE} (shared data)")
def test_tiny_shakespeare_bpe_stream_equals_whole_text_encoding(tmp_path):
    text = SHAKESPEARE.read_text(encoding="utf-8")
    dm = TextDataModule(
        train_files=[str(SHAKESPEARE)], tokenizer="bpe:512", tokenizer_dir=str(tmp_path), block_size=256
    )
    dm.prepare_data()
    dm.setup("fit")
    assert not (SHAKESPEARE.parent / "tokenizers").exists()
    ids = dm.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    n_train = int(len(ids) * 0.9)
    assert dm.train_blocks.flatten().tolist() == ids[: n_train // 256 * 256]
    assert dm.val_blocks.flatten().tolist() == ids[n_train:][: (len(ids) - n_train) // 256 * 256]
    assert dm.tokenizer.decode(dm.val_blocks[0].tolist()) == dm.tokenizer.decode(ids[n_train : n_train + 256])


# ------------------------------------------------------------------------------------------ TextDataModule, Hub

WIKITEXT_ROWS = {  # Salesforce/wikitext raw format: lines keep their "\n", blank lines are empty rows
    "train": ["", " = Valkyria Chronicles III = \n", "", " Senjō no Valkyria 3 : Unrecorded Chronicles \n"] * 6,
    "validation": ["", " = Homarus gammarus = \n", "", " Homarus gammarus , known as the European lobster \n"] * 3,
    "test": ["", " = Robert Boulter = \n", "", " Robert Boulter is an English film , television actor \n"] * 3,
}


def wikitext(splits=("train", "validation", "test")) -> datasets.DatasetDict:
    return datasets.DatasetDict({split: datasets.Dataset.from_dict({"text": WIKITEXT_ROWS[split]}) for split in splits})


@pytest.fixture
def fake_hub(monkeypatch):
    """Route ``datasets.load_dataset`` to an in-memory DatasetDict and record the requested (name, config)."""
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda url: None)
    requested = []

    def install(dataset_dict):
        def load_dataset(name, config=None):
            requested.append((name, config))
            return dataset_dict

        monkeypatch.setattr(datasets, "load_dataset", load_dataset)
        return requested

    return install


def test_wikitext_hub_splits(fake_hub):
    requested = fake_hub(wikitext())
    dm = TextDataModule(tokenizer="byte", block_size=32)
    dm.prepare_data()
    dm.setup()
    assert set(requested) == {("Salesforce/wikitext", "wikitext-103-raw-v1")}
    for split, blocks in (("train", dm.train_blocks), ("validation", dm.val_blocks), ("test", dm.test_blocks)):
        stream = list("".join(WIKITEXT_ROWS[split]).encode())
        assert blocks.flatten().tolist() == stream[: len(stream) // 32 * 32], split
    assert torch.equal(torch.cat([b["input_ids"] for b in dm.test_dataloader()]), dm.test_blocks.long())
    assert torch.equal(torch.cat([b["input_ids"] for b in dm.val_dataloader()]), dm.val_blocks.long())


def test_hub_without_validation_split_holds_out_the_tail(fake_hub):
    fake_hub(wikitext(("train",)))
    dm = TextDataModule(tokenizer="byte", block_size=8, val_fraction=0.2)
    dm.setup("fit")
    stream = list("".join(WIKITEXT_ROWS["train"]).encode())
    n_train = int(len(stream) * 0.8)
    assert dm.train_blocks.flatten().tolist() == stream[: n_train // 8 * 8]
    assert dm.val_blocks.flatten().tolist() == stream[n_train:][: (len(stream) - n_train) // 8 * 8]
    assert dm.test_blocks is None


def test_hub_rows_without_newlines_and_missing_text_column(fake_hub):
    fake_hub(datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["first doc", "", "second\n"] * 9})}))
    dm = TextDataModule(dataset="someone/docs", dataset_config=None, tokenizer="byte", block_size=1)
    dm.setup("fit")
    whole = torch.cat([dm.train_blocks.flatten(), dm.val_blocks.flatten()]).tolist()
    assert bytes(whole).decode() == "first doc\nsecond\n" * 9
    fake_hub(datasets.DatasetDict({"train": datasets.Dataset.from_dict({"content": ["x"]})}))
    with pytest.raises(ValueError, match=f"{FLAG}.dataset=someone/docs.*'text' column"):
        TextDataModule(dataset="someone/docs", tokenizer="byte").setup("fit")


def test_local_parquet_dataset_folder_through_load_dataset(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda url: pytest.fail("no probe for a local folder"))
    folder = tmp_path / "wikitext-like"
    folder.mkdir()
    for split, rows in WIKITEXT_ROWS.items():
        datasets.Dataset.from_dict({"text": rows}).to_parquet(folder / f"{split}.parquet")
    dm = TextDataModule(
        dataset=str(folder), dataset_config=None, tokenizer="bpe:300", tokenizer_dir=str(tmp_path), block_size=16
    )
    dm.prepare_data()
    dm.setup()
    ids = dm.tokenizer("".join(WIKITEXT_ROWS["test"]), add_special_tokens=False)["input_ids"]
    assert dm.test_blocks.flatten().tolist() == ids[: len(ids) // 16 * 16]


def test_hub_unreachable_fails_at_once_naming_the_flags(monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda url: "ConnectError: no network")
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("load_dataset must not be called"))
    dm = TextDataModule(tokenizer="byte")
    assert len(dm.load_tokenizer()) == 257  # an untrained tokenizer does not read the dataset
    for hook in (dm.prepare_data, dm.setup):
        with pytest.raises(ConnectionError, match=rf"{FLAG}.dataset=Salesforce/wikitext.*{FLAG}.train_files"):
            hook()


# ------------------------------------------------------------------------------------------ argument checking


def test_missing_local_files_name_the_flag_and_create_nothing(tmp_path):
    cache = tmp_path / "tok"
    with pytest.raises(FileNotFoundError, match=f"{FLAG}.train_files.*missing.txt"):
        TextDataModule(train_files=[str(tmp_path / "missing.txt")], tokenizer="bpe:300", tokenizer_dir=str(cache))
    write_text(tmp_path / "train.txt")
    with pytest.raises(FileNotFoundError, match=f"{FLAG}.val_files"):
        TextDataModule(train_files=[str(tmp_path / "train.txt")], val_files=[str(tmp_path / "nope.txt")])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["train.txt"]


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"block_size": 0}, "block_size"),
        ({"batch_size": 0}, "batch_size"),
        ({"num_workers": -1}, "num_workers"),
        ({"max_train_blocks": 0}, "max_train_blocks"),
        ({"max_val_blocks": 1.5}, "max_val_blocks"),
        ({"val_fraction": 1.0}, "val_fraction"),
        ({"val_fraction": 0}, "val_fraction"),
        ({"tokenizer": "bpe:abc"}, "tokenizer"),
        ({"tokenizer": "wordpiece:0"}, "tokenizer"),
        ({"train_files": []}, "train_files"),
        ({"train_files": "train.txt"}, "train_files"),
        ({"val_files": ["x.txt"]}, "val_files"),
        ({"dataset": None}, "train_files"),
    ],
)
def test_bad_arguments_name_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=f"{FLAG}.{flag}"):
        TextDataModule(**kwargs)


def test_too_short_split_names_block_size(tmp_path):
    (tmp_path / "tiny.txt").write_text("0123456789" * 3)
    dm = TextDataModule(train_files=[str(tmp_path / "tiny.txt")], tokenizer="byte", block_size=16)
    with pytest.raises(ValueError, match=f"validation split has 3 tokens.*{FLAG}.block_size=16"):
        dm.setup("fit")


def test_lightning_cli_style_parsing(tmp_path):
    from jsonargparse import ArgumentParser
    from lightning.pytorch import LightningDataModule

    write_text(tmp_path / "train.txt")
    parser = ArgumentParser()
    parser.add_subclass_arguments(LightningDataModule, "data")
    config = {"class_path": "layerwise.datamodules.TextDataModule"}
    config["init_args"] = {"train_files": [str(tmp_path / "train.txt")], "tokenizer": "byte", "block_size": 32}
    dm = parser.instantiate_classes(parser.parse_args(["--data", json.dumps(config)])).data
    assert (
        isinstance(dm, TextDataModule)
        and dm.block_size == 32
        and dm.train_files == [(tmp_path / "train.txt").resolve()]
    )


def test_local_pretrained_tokenizer_and_block_size_beyond_its_length_warns(tmp_path):
    saved = byte_tokenizer()
    saved.model_max_length = 16
    saved.save_pretrained(tmp_path / "short")
    write_text(tmp_path / "train.txt")
    dm = TextDataModule(train_files=[str(tmp_path / "train.txt")], tokenizer=str(tmp_path / "short"), block_size=32)
    with pytest.warns(UserWarning, match=f"{FLAG}.block_size=32 exceeds the 16 positions"):
        dm.setup("fit")
    assert dm.vocab_size == 257 and dm.train_blocks.shape[1] == 32


def test_a_text_file_shorter_than_one_block_is_a_usage_error(tmp_path):
    """A UsageError, so `layerwise fit` prints it in one line (LayerwiseCLI._run_subcommand) like the others."""
    from layerwise.datamodules import TextDataModule

    (tmp_path / "train.txt").write_text("a few words\n" * 3)
    data = TextDataModule(train_files=[str(tmp_path / "train.txt")], tokenizer="byte", block_size=64, batch_size=2)
    data.prepare_data()
    with pytest.raises(UsageError, match="fewer than `--data.init_args.block_size`=64|fewer than .*block_size"):
        data.setup("fit")
