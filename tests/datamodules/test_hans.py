"""HANS: the release's file format, the MNLI -> HANS label grouping in every layer, and classifier stitching."""

import json

import pytest
import torch
from helpers import read_summary, trainer
from tiny_models import tiny_config
from transformers import AutoModelForSequenceClassification
from transformers.utils import logging as hf_logging

from layerwise.callbacks import LayerwiseAnalysis
from layerwise.cli import main as cli_main
from layerwise.datamodules import HANSDataModule
from layerwise.datamodules.tokenizers import byte_tokenizer
from layerwise.features import HFEncoder
from layerwise.lightning_modules import Standard
from layerwise.metrics.functional import group_logits

hf_logging.set_verbosity_error()
COLUMNS = ["gold_label", "sentence1_binary_parse", "sentence2_binary_parse", "sentence1_parse", "sentence2_parse",
           "sentence1", "sentence2", "pairID", "heuristic", "subcase", "template"]  # fmt: skip
HEURISTICS = ["lexical_overlap", "subsequence", "constituent"]


def write_hans(folder, rows_per_heuristic: int = 12):
    """heuristics_evaluation_set.txt as the HANS release writes it (tab-separated, parses included)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["\t".join(COLUMNS)]
    words = ["the doctor", "the lawyer", "the artist", "the judge", "the actor", "the student"]
    for h, heuristic in enumerate(HEURISTICS):
        for i in range(rows_per_heuristic):
            a, b = words[i % 6], words[(i + h + 1) % 6]
            label = "entailment" if (i + h) % 3 == 0 else "non-entailment"
            premise, hypothesis = f"{a} saw {b} .", f"{b} saw {a} ." if label != "entailment" else f"{a} saw {b} ."
            lines.append("\t".join([label, "( x )", "( y )", "(ROOT x)", "(ROOT y)", premise, hypothesis,
                                    f"ex{h}_{i}", heuristic, f"{heuristic}_sub", "temp1"]))  # fmt: skip
    (folder / "heuristics_evaluation_set.txt").write_text("\n".join(lines) + "\n")
    return folder


def mnli_bert(folder, seed: int = 0):
    """A tiny random 3-class BERT (an 'MNLI model') whose vocabulary covers the byte tokenizer."""
    torch.manual_seed(seed)
    config = tiny_config(
        "bert", num_hidden_layers=2, hidden_size=16, num_attention_heads=2, intermediate_size=32,
        vocab_size=len(byte_tokenizer()), num_labels=3, max_position_embeddings=128,
    )  # fmt: skip
    model = AutoModelForSequenceClassification.from_config(config)
    with torch.no_grad():
        model.classifier.weight.mul_(40.0)  # spread the three logits so every class wins somewhere
    model.save_pretrained(folder)
    return folder


def test_hans_file_heuristic_filter_and_labels(tmp_path):
    data = HANSDataModule(heuristic="lexical_overlap", data_dir=str(write_hans(tmp_path)), tokenizer="byte")
    split = data.read_split()
    assert len(split.texts) == 12 and split.labels == [0 if i % 3 == 0 else 1 for i in range(12)]
    assert split.texts[1] == ("the lawyer saw the artist .", "the artist saw the lawyer .")
    assert len(HANSDataModule(data_dir=str(tmp_path), tokenizer="byte").read_split().texts) == 36
    data.setup("validate")
    batch = next(iter(data.val_dataloader()))
    assert set(batch) >= {"input_ids", "attention_mask", "labels"} and batch["labels"].shape == (12,)
    assert data.num_classes == 2 and data.model_classes == 3 and data.label_groups == [[0], [1, 2]]
    for bad, match in (({"heuristic": "negation"}, "heuristic"), ({"label_groups": [[0], [0, 1]]}, "label_groups"),
                       ({"grouping": "mean"}, "grouping")):  # fmt: skip
        with pytest.raises(ValueError, match=f"--data.init_args.{match}"):
            HANSDataModule(data_dir=str(tmp_path), **bad)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="heuristics_evaluation_set.txt"):
        HANSDataModule(data_dir=str(tmp_path / "empty"), tokenizer="byte")


def test_hans_from_an_unreachable_hub_names_data_dir(monkeypatch):
    import datasets

    from layerwise import hub

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda url, timeout_s=None: "connection refused")
    with pytest.raises(ConnectionError, match="--data.init_args.data_dir=/path/to/hans"):
        HANSDataModule(tokenizer="byte").prepare_data()


def test_group_logits_max_is_argmax_then_map_and_logsumexp_sums_probabilities():
    logits = torch.randn(5, 200, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    groups = [[0], [1, 2]]
    mapped = torch.tensor([0, 1, 1])[logits.argmax(-1)]  # McCoy et al.'s rule: argmax, then map
    assert torch.equal(group_logits(logits, groups, "max").argmax(-1), mapped)
    summed = group_logits(logits, groups, "logsumexp").log_softmax(-1).exp()
    probabilities = logits.softmax(-1)
    torch.testing.assert_close(summed[..., 1], probabilities[..., 1] + probabilities[..., 2], rtol=0, atol=1e-12)
    assert not torch.equal(summed.argmax(-1), mapped)  # the two rules really differ on some samples


@pytest.mark.parametrize("grouping", ["max", "logsumexp"])
def test_mnli_model_on_hans_every_layer_grouped(tmp_path, grouping):
    """LayerwiseAnalysis of a 3-class model on HANS: each layer's accuracy is HANS's, computed here by hand."""
    folder = mnli_bert(tmp_path / "bert")
    data = HANSDataModule(data_dir=str(write_hans(tmp_path / "hans")), tokenizer="byte", batch_size=5,
                          grouping=grouping)  # fmt: skip
    module = Standard(HFEncoder(str(folder), num_classes=3)).double()
    fit = trainer(tmp_path / "run", [LayerwiseAnalysis(log_figures=False)])
    metrics = fit.validate(module, datamodule=data, verbose=False)[0]
    summary = read_summary(tmp_path / "run")
    model = AutoModelForSequenceClassification.from_pretrained(folder).double().eval()
    correct, count = torch.zeros(2, dtype=torch.float64), 0
    for batch in data.val_dataloader():
        labels = batch.pop("labels")
        hidden = model(**batch, output_hidden_states=True).hidden_states[1:]
        for layer, h in enumerate(hidden):  # BERT's own head on [CLS]: pooler, dropout (off), classifier
            logits = model.classifier(model.bert.pooler(h))
            if grouping == "max":
                predicted = torch.tensor([0, 1, 1])[logits.argmax(-1)]
            else:
                p = logits.softmax(-1)
                predicted = (p[:, 1] + p[:, 2] > p[:, 0]).long()
            correct[layer] += (predicted == labels).sum()
        count += len(labels)
    expected = (correct / count).tolist()
    assert summary["accuracy"] == pytest.approx(expected, abs=1e-12)
    assert metrics["val/acc"] == pytest.approx(expected[-1], abs=1e-6)
    assert 0 < min(expected) and max(expected) < 1  # neither trivially right nor wrong


@pytest.mark.filterwarnings("ignore:.*no separator")  # the byte tokenizer on a pair task
def test_stitch_command_classifiers_with_hans(tmp_path, capsys):
    """`layerwise stitch --task classification`: MNLI classifiers stitched, accuracy drops on MNLI and HANS."""
    a, b = mnli_bert(tmp_path / "a", seed=0), mnli_bert(tmp_path / "b", seed=1)
    glue = tmp_path / "MNLI"
    glue.mkdir()
    header = "sentence1\tsentence2\tgold_label\n"
    rows = "".join(f"the cat {i} sat .\tthe dog {i % 5} ran .\t{['entailment', 'neutral', 'contradiction'][i % 3]}\n"
                   for i in range(30))  # fmt: skip
    for name in ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv"):
        (glue / name).write_text(header + rows)
    hans = write_hans(tmp_path / "hans")
    base = ["stitch", "--model_a", str(a), "--model_b", str(b), "--task", "classification", "--glue_task", "mnli",
            "--data_dir", str(glue), "--tokenizer", "byte", "--hans", "true", "--hans_dir", str(hans)]  # fmt: skip
    cli_main([*base, "--phi", "identity", "--layers", "1", "--out", str(tmp_path / "identity")])
    row = json.loads((tmp_path / "identity" / "stitch.json").read_text())["rows"][0]
    assert {"acc_drop_b", "hans_acc_stitched", "hans_acc_drop_b"} <= set(row)
    assert (tmp_path / "identity" / "stitch.png").stat().st_size > 0
    # A model stitched to itself with identity is the model: no drop anywhere.
    cli_main([*base[:4], str(a), *base[5:], "--phi", "identity", "--layers", "1", "--out", str(tmp_path / "self")])
    same = json.loads((tmp_path / "self" / "stitch.json").read_text())["rows"][0]
    assert same["acc_drop_b"] == 0 and same["hans_acc_drop_b"] == 0 and abs(same["penalty_b"]) < 1e-6
    cli_main([*base, "--pairs", "1:1", "--steps", "2", "--warmup_steps", "1", "--out", str(tmp_path / "learned")])
    assert json.loads((tmp_path / "learned" / "stitch.json").read_text())["rows"][0]["layer_a"] == 1
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli_main(["stitch", "--model_a", str(a), "--model_b", str(b), "--task", "classification", "--out", "never"])
    assert "give --glue_task" in capsys.readouterr().err
