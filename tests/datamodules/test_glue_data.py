"""GLUEDataModule: original GLUE TSV layouts, csv/json files, the real local SST-2, the Hub path (offline), errors."""

import json
import socket
import time
import warnings
from pathlib import Path

import datasets
import pytest
import torch

from layerwise import hub
from layerwise.datamodules import GLUEDataModule, glue
from layerwise.datamodules.tokenizers import byte_tokenizer

SST2_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "sst2"
DATA_DIR_FLAG = "--data.init_args.data_dir"

# (texts, label as written in the original TSV, label id on the Hub). Quotes are stray on purpose, as in GLUE.
EXAMPLES = {
    "sst2": [
        (("\" the emperor 's new clothes , sort of",), "0", 0),
        (("it 's a charming and often affecting journey .",), "1", 1),
        (("unflinchingly bleak and desperate",), "0", 0),
    ],
    "mrpc": [
        (
            (
                'Amrozi accused his brother , whom he called " the witness " , of deliberately distorting his story .',
                'Referring to him as only " the witness " , Amrozi accused his brother of deliberately distorting it .',
            ),
            "1",
            1,
        ),
        (("Yucaipa owned Dominick 's before 1998 .", "Yucaipa bought Dominick 's in 1995 ."), "0", 0),
        (('He said " no .', "He declined ."), "1", 1),
    ],
    "qqp": [
        (("How is the life of a math student?", 'Which level of "prep is enough for the exam jlpt5?'), "0", 0),
        (("How do I control my emotions?", "How do you control your emotions?"), "1", 1),
        (("What is 2+2?", ""), "0", 0),
    ],
    "mnli": [
        (
            ("Conceptually cream skimming has two basic dimensions .", "Product and geography are what work ."),
            "neutral",
            1,
        ),
        (("you know during the season", 'You lose the " things to the next level'), "entailment", 0),
        (("One of our number will carry out your instructions .", "A member of my team will not."), "contradiction", 2),
    ],
    "qnli": [
        (
            ("When did the third Digimon series begin?", 'Unlike the two seasons before it , " Tamers'),
            "not_entailment",
            1,
        ),
        (("Which missile batteries often have individual launchers?", "Each battery has launchers ."), "entailment", 0),
        (("What is a quote?", '"'), "not_entailment", 1),
    ],
    "rte": [
        (
            ("No Weapons of Mass Destruction Found in Iraq Yet.", "Weapons of Mass Destruction Found in Iraq."),
            "not_entailment",
            1,
        ),
        (
            ('A place of " sorrow , after Pope John Paul II died .', "Pope Benedict XVI is the new leader."),
            "entailment",
            0,
        ),
        (("Herceptin was already approved .", "Herceptin can be used."), "entailment", 0),
    ],
}
MNLI_PARSES = "( ( a b ) c )\t( d e )\t(ROOT (S a))\t(ROOT (S d))"


def tsv_row(task: str, index: int, texts: tuple, label: str) -> str:
    """One row in the layout of the original GLUE train/dev TSV of ``task``."""
    if task == "sst2":
        return f"{texts[0]}\t{label}"
    if task == "mrpc":
        return f"{label}\t{1000 + index}\t{2000 + index}\t{texts[0]}\t{texts[1]}"
    if task == "qqp":
        return f"{index}\t{2 * index + 1}\t{2 * index + 2}\t{texts[0]}\t{texts[1]}\t{label}"
    if task == "mnli":
        return (
            f"{index}\t{31193 + index}\t{index}n\tgovernment\t{MNLI_PARSES}\t{texts[0]}\t{texts[1]}\t{label}\t{label}"
        )
    return f"{index}\t{texts[0]}\t{texts[1]}\t{label}"  # qnli, rte


TSV_HEADERS = {
    "sst2": "sentence\tlabel",
    "mrpc": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String",  # GLUE's MRPC files start with a byte-order mark
    "qqp": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
    "mnli": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
    "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label",
    "qnli": "index\tquestion\tsentence\tlabel",
    "rte": "index\tsentence1\tsentence2\tlabel",
}
# The original test.tsv files: an index (or id) and the texts, no label.
TEST_HEADERS = {
    "sst2": "index\tsentence",
    "mrpc": "index\t#1 ID\t#2 ID\t#1 String\t#2 String",
    "qqp": "id\tquestion1\tquestion2",
    "qnli": "index\tquestion\tsentence",
    "rte": "index\tsentence1\tsentence2",
}


def write_tsv(path: Path, task: str, examples) -> None:
    rows = [tsv_row(task, i, texts, label) for i, (texts, label, _) in enumerate(examples)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([TSV_HEADERS[task], *rows]) + "\n", encoding="utf-8")


def write_test_tsv(path: Path, task: str, examples) -> None:
    rows = [(["0", "1"] if task == "mrpc" else []) + list(texts) for texts, _, _ in examples]
    lines = [TEST_HEADERS[task]] + [f"{i}\t" + "\t".join(row) for i, row in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def texts_and_ids(examples):
    return [texts for texts, _, _ in examples], [label_id for _, _, label_id in examples]


@pytest.fixture
def online_mode(monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)


# ------------------------------------------------------------------------------------- original GLUE TSV files


@pytest.mark.parametrize("task", sorted(EXAMPLES))
def test_original_tsv_layouts(tmp_path, task):
    examples = EXAMPLES[task]
    folder = tmp_path / glue.TASKS[task].folder  # the layout of the GLUE download: glue_data/<TASK>/train.tsv
    write_tsv(folder / "train.tsv", task, examples)
    if task == "mnli":
        write_tsv(folder / "dev_matched.tsv", task, examples[::-1])
        write_tsv(folder / "dev_mismatched.tsv", task, examples[:1])
    else:
        write_tsv(folder / "dev.tsv", task, examples[::-1])
        write_test_tsv(folder / "test.tsv", task, examples)
    dm = GLUEDataModule(task=task, data_dir=str(tmp_path), tokenizer="byte")
    assert dm.num_classes == (3 if task == "mnli" else 2)

    train = dm.read_split("train")
    assert (train.texts, train.labels) == texts_and_ids(examples)
    assert all(len(texts) == (1 if task == "sst2" else 2) for texts in train.texts)
    validation = dm.read_split("validation")
    assert (validation.texts, validation.labels) == texts_and_ids(examples[::-1])
    if task == "mnli":
        test = dm.read_split("test")  # the mismatched validation set
        assert test.source.endswith("dev_mismatched.tsv") and test.labels == [examples[0][2]]
    else:
        with pytest.warns(UserWarning, match="test split has unlabelled examples"):
            test = dm.read_split("test")  # the unlabelled test.tsv is not served
        assert test.source.endswith("dev.tsv")


@pytest.mark.filterwarnings("ignore:.*no separator")  # the byte tokenizer on a pair task
def test_mnli_validation_routing(tmp_path):
    examples = EXAMPLES["mnli"]
    write_tsv(tmp_path / "train.tsv", "mnli", examples)
    write_tsv(tmp_path / "dev_matched.tsv", "mnli", examples[:2])
    write_tsv(tmp_path / "dev_mismatched.tsv", "mnli", examples[2:])
    for served, other in (("matched", "mismatched"), ("mismatched", "matched")):
        dm = GLUEDataModule(task="mnli", mnli_validation=served, data_dir=str(tmp_path), tokenizer="byte")
        dm.setup()
        assert dm.val_set.split.source.endswith(f"dev_{served}.tsv")
        assert dm.test_set.split.source.endswith(f"dev_{other}.tsv")
        expected = [0, 1] if served == "matched" else [2]  # neutral, entailment -> ids 1, 0; contradiction -> 2
        assert sorted(torch.cat([batch["labels"] for batch in dm.val_dataloader()]).tolist()) == expected
        predicted = torch.cat([batch["labels"] for batch in dm.predict_dataloader()]).tolist()
        assert sorted(predicted) == expected


def test_pairs_tokenised_as_pairs_and_truncated(tmp_path):
    examples = EXAMPLES["mrpc"]
    write_tsv(tmp_path / "train.tsv", "mrpc", examples)
    write_tsv(tmp_path / "dev.tsv", "mrpc", examples)
    dm = GLUEDataModule(task="mrpc", data_dir=str(tmp_path), tokenizer="wordpiece:120", max_length=12, batch_size=3)
    dm.prepare_data()
    assert [path.name for path in (tmp_path / "tokenizers").iterdir()][0].startswith("wordpiece-120-")
    dm.setup("fit")
    tokenizer = dm.tokenizer
    batch = next(iter(dm.val_dataloader()))
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    assert batch["labels"].tolist() == [1, 0, 1]
    lengths = batch["attention_mask"].sum(1).tolist()
    assert lengths[0] == 12 and max(lengths) == batch["input_ids"].shape[1]  # truncated, padded to the longest
    for row, types, mask in zip(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]):
        ids = row[mask.bool()].tolist()
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        first_sep = ids.index(tokenizer.sep_token_id)
        assert ids.count(tokenizer.sep_token_id) == 2 and first_sep < len(ids) - 1
        assert types[mask.bool()].tolist() == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
        assert row[~mask.bool()].eq(tokenizer.pad_token_id).all()
    for row, (texts, _, _) in zip(batch["input_ids"], examples):
        expected = tokenizer(*texts, truncation=True, max_length=12)["input_ids"]
        assert row[: len(expected)].tolist() == expected


# ------------------------------------------------------------------------------------ csv / json with Hub names


def hub_dataset(task: str, examples, labels=None) -> datasets.Dataset:
    """A Dataset with the Hub's columns and features for ``task``."""
    spec = glue.TASKS[task]
    columns = spec.text_columns[0]
    data = {name: [texts[i] for texts, _, _ in examples] for i, name in enumerate(columns)}
    data["label"] = [label_id for _, _, label_id in examples] if labels is None else labels
    data["idx"] = list(range(len(examples)))
    features = {name: datasets.Value("string") for name in columns}
    features["label"] = datasets.ClassLabel(names=list(spec.label_names))
    features["idx"] = datasets.Value("int32")
    return datasets.Dataset.from_dict(data, features=datasets.Features(features))


@pytest.mark.parametrize("fmt", ["csv", "json-lines", "json-records", "json-columns", "jsonl"])
def test_csv_and_json_with_hub_column_names(tmp_path, fmt):
    examples = EXAMPLES["rte"]
    train = hub_dataset("rte", examples)
    if fmt == "csv":
        train.to_csv(tmp_path / "train.csv")
    elif fmt == "json-lines":
        train.to_json(tmp_path / "train.json")  # datasets writes JSON Lines by default
    elif fmt == "json-records":
        train.to_json(tmp_path / "train.json", lines=False, orient="records")
    elif fmt == "json-columns":
        (tmp_path / "train.json").write_text(json.dumps(train.to_dict()), encoding="utf-8")  # a dict of columns
    else:
        train.to_json(tmp_path / "train.jsonl")
    # Labels may also be written as names.
    rows = ["sentence1,sentence2,label"] + [f'"{a.replace(chr(34), 2 * chr(34))}",{b},{y}' for (a, b), y, _ in examples]
    (tmp_path / "validation.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    dm = GLUEDataModule(task="rte", data_dir=str(tmp_path), tokenizer="byte")
    train_split = dm.read_split("train")
    assert (train_split.texts, train_split.labels) == texts_and_ids(examples)
    validation = dm.read_split("validation")
    assert (validation.texts, validation.labels) == texts_and_ids(examples)


@pytest.mark.filterwarnings("ignore:.*no separator")  # the byte tokenizer on a pair task
def test_labelled_local_test_split_is_served(tmp_path):
    examples = EXAMPLES["qnli"]
    for name in ("train.jsonl", "validation.jsonl"):
        hub_dataset("qnli", examples).to_json(tmp_path / name)
    hub_dataset("qnli", examples[:2]).to_json(tmp_path / "test.jsonl")
    dm = GLUEDataModule(task="qnli", data_dir=str(tmp_path), tokenizer="byte", batch_size=8)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*serves the validation split")  # no fallback to validation
        dm.setup("test")
    assert dm.test_set.split.source.endswith("test.jsonl")
    assert next(iter(dm.test_dataloader()))["labels"].tolist() == [1, 0]


# ---------------------------------------------------------------------------------------------- the real SST-2


@pytest.mark.skipif(not SST2_DIR.is_dir(), reason=f"the local SST-2 copy is absent ({SST2_DIR})")
def test_real_sst2_with_wordpiece(tmp_path):
    kwargs = dict(tokenizer="wordpiece:2000", tokenizer_dir=str(tmp_path), max_length=32, batch_size=16)
    dm = GLUEDataModule(data_dir=str(SST2_DIR), max_train_samples=100, **kwargs)
    assert dm.metrics == ("accuracy",) and dm.num_classes == 2
    dm.prepare_data()
    dm.setup()
    assert len(dm.train_set) == 100 and len(dm.val_set) == 872
    assert len(dm.test_set) == 1821 and dm.test_set.split.source.endswith("test.tsv")  # this copy has test labels
    assert dm.vocab_size == len(dm.tokenizer) <= 2000
    assert sum(dm.val_set.split.labels) == 444  # positives in the SST-2 validation split

    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    size, length = batch["input_ids"].shape
    assert size == 16 and length <= 32
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert batch[key].shape == (16, length) and batch[key].dtype == torch.int64
    assert batch["labels"].shape == (16,) and batch["labels"].dtype == torch.int64
    assert set(batch["labels"].tolist()) <= {0, 1}
    assert batch["input_ids"][:, 0].eq(dm.tokenizer.cls_token_id).all()
    assert batch["token_type_ids"].eq(0).all()

    val = next(iter(dm.val_dataloader()))
    expected = dm.tokenizer("one long string of cliches .")["input_ids"]  # the first validation sentence
    assert val["input_ids"][0, : len(expected)].tolist() == expected and val["labels"][0] == 0

    # A second datamodule reloads the cached tokenizer instead of training another.
    again = GLUEDataModule(data_dir=str(SST2_DIR), max_train_samples=100, **kwargs)
    again.setup("validate")
    assert len(list(tmp_path.iterdir())) == 1
    assert again.tokenizer.get_vocab() == dm.tokenizer.get_vocab()


# ----------------------------------------------------------------------------------------- Hub path, offline


@pytest.fixture
def fake_hub(monkeypatch):
    """Route ``datasets.load_dataset`` to an in-memory DatasetDict and record the requested (path, config)."""
    requested = []

    def install(dataset_dict):
        def load_dataset(path, name=None):
            requested.append((path, name))
            return dataset_dict

        monkeypatch.setattr(hub, "hub_unreachable_reason", lambda url: None)
        monkeypatch.setattr(datasets, "load_dataset", load_dataset)
        return requested

    return install


def test_hub_sst2(fake_hub, online_mode):
    examples = EXAMPLES["sst2"]
    requested = fake_hub(
        datasets.DatasetDict(
            train=hub_dataset("sst2", examples),
            validation=hub_dataset("sst2", examples[:2]),
            test=hub_dataset("sst2", examples, labels=[-1, -1, -1]),
        )
    )
    dm = GLUEDataModule(tokenizer="byte", batch_size=4)
    dm.prepare_data()
    with pytest.warns(UserWarning, match="serves the validation split"):
        dm.setup()
    assert requested == [("nyu-mll/glue", "sst2")]
    assert (dm.train_set.split.texts, dm.train_set.split.labels) == texts_and_ids(examples)
    assert dm.test_set.split.source == "nyu-mll/glue/sst2:validation"
    batch = next(iter(dm.val_dataloader()))
    assert set(batch) == {"input_ids", "attention_mask", "labels"}  # the byte tokenizer has no token_type_ids
    assert batch["labels"].tolist() == [0, 1] and batch["input_ids"].dtype == torch.int64
    assert dm.vocab_size == 257
    text = examples[1][0][0].encode()
    assert batch["input_ids"][1, : len(text)].tolist() == list(text)


@pytest.mark.filterwarnings("ignore:.*no separator")  # asserted once below, then expected
def test_hub_mnli_routing(fake_hub, online_mode):
    examples = EXAMPLES["mnli"]
    requested = fake_hub(
        datasets.DatasetDict(
            train=hub_dataset("mnli", examples),
            validation_matched=hub_dataset("mnli", examples[:1]),
            validation_mismatched=hub_dataset("mnli", examples[1:]),
            test_matched=hub_dataset("mnli", examples, labels=[-1, -1, -1]),
        )
    )
    with pytest.warns(UserWarning, match="no separator"):  # byte tokenizer on a pair task
        GLUEDataModule(task="mnli", tokenizer="byte").setup("validate")
    dm = GLUEDataModule(task="mnli", mnli_validation="mismatched", tokenizer="byte")
    dm.setup()
    assert requested == [("nyu-mll/glue", "mnli")] * 2
    assert (dm.val_set.split.texts, dm.val_set.split.labels) == texts_and_ids(examples[1:])
    assert dm.test_set.split.source == "nyu-mll/glue/mnli:validation_matched" and dm.test_set.split.labels == [1]
    assert dm.read_split("train").texts[0] == examples[0][0]  # premise, hypothesis


def test_hub_unlabelled_training_rows_are_rejected(fake_hub, online_mode):
    fake_hub(datasets.DatasetDict(train=hub_dataset("rte", EXAMPLES["rte"], labels=[0, -1, 1])))
    with pytest.raises(ValueError, match=r"nyu-mll/glue/rte:train, row 2: no label"):
        GLUEDataModule(task="rte", tokenizer="byte").read_split("train")


def test_hub_unreachable_fails_at_once(monkeypatch, online_mode, tmp_path):
    def closed_port_url() -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return f"http://127.0.0.1:{s.getsockname()[1]}"

    def fail_if_called(*args, **kwargs):
        raise AssertionError("load_dataset must not be called when the Hub is unreachable")

    monkeypatch.setattr(hub, "hub_endpoint", closed_port_url)
    monkeypatch.setattr(datasets, "load_dataset", fail_if_called)
    dm = GLUEDataModule(task="qqp", tokenizer="wordpiece:100", tokenizer_dir=str(tmp_path / "tok"))
    for hook in (dm.prepare_data, dm.setup):
        start = time.perf_counter()
        with pytest.raises(ConnectionError, match=DATA_DIR_FLAG):
            hook()
        assert time.perf_counter() - start < 3.0
    assert not (tmp_path / "tok").exists()


# ------------------------------------------------------------------------------------------------------- errors


def test_metrics_and_num_classes_right_after_init():
    expected = {"sst2": 2, "mrpc": 2, "qqp": 2, "mnli": 3, "qnli": 2, "rte": 2}
    for task, num_classes in expected.items():
        dm = GLUEDataModule(task=task)
        assert dm.num_classes == num_classes
        assert dm.metrics == (("accuracy", "f1") if task in ("mrpc", "qqp") else ("accuracy",))
        assert dm.tokenizer is None and dm.vocab_size is None


@pytest.mark.parametrize(
    ("kwargs", "error", "option"),
    [
        ({"task": "cola"}, ValueError, "task"),
        ({"task": "mnli", "mnli_validation": "both"}, ValueError, "mnli_validation"),
        ({"max_length": 0}, ValueError, "max_length"),
        ({"max_length": 4}, ValueError, "max_length"),
        ({"max_length": 64.0}, ValueError, "max_length"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"num_workers": -1}, ValueError, "num_workers"),
        ({"max_train_samples": 0}, ValueError, "max_train_samples"),
        ({"max_val_samples": True}, ValueError, "max_val_samples"),
        ({"tokenizer": ""}, ValueError, "tokenizer"),
        ({"data_dir": "missing"}, FileNotFoundError, "data_dir"),
        ({"data_dir": "no_dev"}, FileNotFoundError, "data_dir"),
        ({"data_dir": "two_dev"}, ValueError, "data_dir"),
    ],
)
def test_bad_arguments_name_the_flag_before_writing(tmp_path, kwargs, error, option):
    (tmp_path / "no_dev").mkdir()
    write_tsv(tmp_path / "no_dev" / "train.tsv", "sst2", EXAMPLES["sst2"])
    (tmp_path / "two_dev").mkdir()
    for name in ("train.tsv", "dev.tsv", "validation.tsv"):
        write_tsv(tmp_path / "two_dev" / name, "sst2", EXAMPLES["sst2"])
    if "data_dir" in kwargs:
        kwargs = {**kwargs, "data_dir": str(tmp_path / kwargs["data_dir"])}
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(error, match=f"--data.init_args.{option}"):
        GLUEDataModule(tokenizer_dir=str(tmp_path / "tok"), **{"tokenizer": "wordpiece:100", **kwargs})
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("a film\t", r"train.tsv, row 2: no label in column 'label'"),
        ("a film\t-1", r"train.tsv, row 2: no label"),
        ("a film\tmaybe", r"train.tsv, row 2: unknown sst2 label 'maybe'"),
        ("a film\t2", r"train.tsv, row 2: unknown sst2 label 2"),
        ("a film", r"train.tsv, row 2: no label"),
    ],
)
def test_unlabelled_or_bad_training_rows_are_rejected(tmp_path, row, message):
    (tmp_path / "train.tsv").write_text(f"sentence\tlabel\ngood\t1\n{row}\n", encoding="utf-8")
    write_tsv(tmp_path / "dev.tsv", "sst2", EXAMPLES["sst2"])
    with pytest.raises(ValueError, match=message):
        GLUEDataModule(data_dir=str(tmp_path), tokenizer="byte").read_split("train")


def test_short_rows_and_missing_columns_are_rejected(tmp_path):
    write_tsv(tmp_path / "dev.tsv", "mrpc", EXAMPLES["mrpc"])
    (tmp_path / "train.tsv").write_text(TSV_HEADERS["mrpc"] + "\n1\t1\t2\tonly one string\n", encoding="utf-8")
    dm = GLUEDataModule(task="mrpc", data_dir=str(tmp_path), tokenizer="byte")
    with pytest.raises(ValueError, match=r"row 1: no text in column\(s\) \['#1 String', '#2 String'\]"):
        dm.read_split("train")
    (tmp_path / "train.tsv").write_text("text\tlabel\nhello\t1\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"lacks the mrpc text column"):
        dm.read_split("train")


def test_max_length_beyond_the_tokenizer_limit(tmp_path, monkeypatch):
    write_tsv(tmp_path / "train.tsv", "sst2", EXAMPLES["sst2"])
    write_tsv(tmp_path / "dev.tsv", "sst2", EXAMPLES["sst2"])
    limited = byte_tokenizer()
    limited.model_max_length = 16
    monkeypatch.setattr(glue, "load_tokenizer", lambda *args, **kwargs: limited)
    with pytest.raises(ValueError, match=r"--data.init_args.max_length=32 exceeds the 16 tokens"):
        GLUEDataModule(data_dir=str(tmp_path), tokenizer="some/hub-tokenizer", max_length=32).setup()


def test_a_header_only_file_is_named(tmp_path):
    folder = tmp_path / glue.TASKS["sst2"].folder
    write_tsv(folder / "train.tsv", "sst2", [])
    write_tsv(folder / "dev.tsv", "sst2", EXAMPLES["sst2"])
    dm = GLUEDataModule(task="sst2", data_dir=str(tmp_path), tokenizer="byte")
    with pytest.raises(ValueError, match=r"--data.init_args.data_dir=.*train.tsv has a header but no rows"):
        dm.read_split("train")
