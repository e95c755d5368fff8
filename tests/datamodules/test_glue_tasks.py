"""Reading and checking GLUE files is its own part (``glue_tasks.GLUESource``), usable without a tokenizer
or a LightningDataModule; ``GLUEDataModule`` reads through it and the old import paths still answer."""

import pytest

from layerwise.datamodules import GLUEDataModule, glue, glue_tasks
from layerwise.errors import UsageError


def write_sst2(folder, train="sentence\tlabel\na good film\t1\na bad film\tnegative\n"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.tsv").write_text(train, encoding="utf-8")
    (folder / "dev.tsv").write_text("sentence\tlabel\nfine\t1\n", encoding="utf-8")
    return folder


def test_a_source_reads_and_checks_the_files_without_a_tokenizer(tmp_path):
    folder = write_sst2(tmp_path / "SST-2")
    source = glue_tasks.GLUESource("sst2", {"train": "train", "validation": "validation", "test": "test"}, tmp_path)
    assert source.files == {"train": folder / "train.tsv", "validation": folder / "dev.tsv", "test": None}
    train = source.read("train")
    assert train.texts == [("a good film",), ("a bad film",)] and train.labels == [1, 0]
    assert source.read("test") is None
    write_sst2(folder, "sentence\tlabel\na film\t7\n")
    with pytest.raises(UsageError, match=r"train.tsv, row 1: unknown sst2 label 7"):
        source.read("train")


def test_the_datamodule_reads_through_its_source_and_old_imports_answer(tmp_path):
    write_sst2(tmp_path)
    dm = GLUEDataModule(data_dir=str(tmp_path), tokenizer="byte")
    assert isinstance(dm.source, glue_tasks.GLUESource) and dm.files is dm.source.files
    assert dm.read_split("train").labels == [1, 0]
    assert glue.TASKS is glue_tasks.TASKS and glue.TextSplit is glue_tasks.TextSplit
    from layerwise.datamodules.glue import MIN_MAX_LENGTH, TextSplit, TokenizedSplit, padded_loader  # noqa: F401 (hans)
