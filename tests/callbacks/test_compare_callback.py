"""CrossModelComparison: CKA of the trained model against a frozen second model on every validation batch."""

import json

import pytest
import torch
from helpers import assert_json_close, read_summary, trainer
from tiny_models import decoder, tiny_config
from torch.utils.data import DataLoader

from layerwise.callbacks import CrossModelComparison
from layerwise.features.hooks import collect_block_outputs
from layerwise.lightning_modules import Standard
from layerwise.metrics.functional_compare import arccos_distance, cross_cka


def padded_loader() -> DataLoader:
    """7 sequences of 9 tokens, right padding of 0..3 positions."""
    ids = torch.randint(2, 97, (7, 9), generator=torch.Generator().manual_seed(5))
    rows = []
    for index, row in enumerate(ids):
        mask = torch.ones_like(row)
        if index % 4:
            mask[9 - index % 4 :] = 0
        rows.append({"input_ids": row, "attention_mask": mask})
    return DataLoader(rows, batch_size=3)


def direct(model_a, model_b, mask_padding: bool = True) -> torch.Tensor:
    """Cross-model CKA from every block's output over the loader, computed in one piece."""
    features = {"a": [], "b": []}
    for batch in padded_loader():
        for name, model in (("a", model_a), ("b", model_b)):
            outputs = collect_block_outputs(model.transformer.h, lambda model=model, batch=batch: model(**batch))
            stacked = torch.stack([h.detach().double() for h in outputs])
            mask = batch["attention_mask"].bool()
            features[name].append(stacked[:, mask] if mask_padding else stacked.flatten(1, 2))
    return cross_cka(torch.cat(features["a"], 1), torch.cat(features["b"], 1))


@pytest.fixture(scope="module")
def folder_b(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("model_b"))
    decoder("gpt2", seed=1).model.float().save_pretrained(folder)
    return folder


@pytest.mark.parametrize("mask_padding", [True, False])
def test_comparison_equals_a_direct_computation(tmp_path, folder_b, mask_padding):
    backbone = decoder("gpt2")
    callback = CrossModelComparison(folder_b, mask_padding=mask_padding, minibatch=True, chunk=16)
    trainer(tmp_path, [callback]).validate(Standard(backbone).double(), padded_loader(), verbose=False)
    compare = read_summary(tmp_path)["compare"]
    from transformers import AutoModelForCausalLM

    model_b = AutoModelForCausalLM.from_pretrained(folder_b).double().eval()
    expected = direct(backbone.model, model_b, mask_padding)
    torch.testing.assert_close(torch.tensor(compare["cka"], dtype=torch.float64), expected, rtol=0, atol=1e-6)
    assert compare["arccos_distance"] == pytest.approx(arccos_distance(expected).item(), abs=1e-5)
    assert compare["num_tokens"] == (sum(9 - index % 4 for index in range(7)) if mask_padding else 63)
    assert len(compare["minibatch_cka_mean"]) == 3 and compare["layers_a"] == [1, 2, 3]
    masked, unmasked = direct(backbone.model, model_b, True), direct(backbone.model, model_b, False)
    assert not torch.allclose(masked, unmasked)  # padding changes the result, so masking matters


def test_diagonal_pairs_in_the_callback(tmp_path, folder_b):
    """pairs='diagonal': CKA(i, i) of the direct computation, null elsewhere in the JSON, the same distance."""
    backbone = decoder("gpt2")
    callback = CrossModelComparison(folder_b, pairs="diagonal", log_figures=True)
    trainer(tmp_path, [callback]).validate(Standard(backbone).double(), padded_loader(), verbose=False)
    compare = read_summary(tmp_path)["compare"]
    from transformers import AutoModelForCausalLM

    expected = direct(backbone.model, AutoModelForCausalLM.from_pretrained(folder_b).double().eval())
    assert compare["pairs"] == "diagonal" and compare["cka"][0][1] is None
    torch.testing.assert_close(torch.tensor([compare["cka"][i][i] for i in range(3)]), expected.diagonal().float(),
                               rtol=0, atol=1e-6)  # fmt: skip
    assert compare["arccos_distance"] == pytest.approx(arccos_distance(expected).item(), abs=1e-5)


def test_fast_precision_in_the_callback_is_within_its_stated_error(tmp_path, folder_b):
    """precision='fast' (float32 products of float32 models, float64 sums): within 1e-4 of the float64 reference."""
    backbone = decoder("gpt2")
    callback = CrossModelComparison(folder_b, precision="fast", log_figures=False)
    trainer(tmp_path, [callback]).validate(Standard(backbone).float(), padded_loader(), verbose=False)
    compare = read_summary(tmp_path)["compare"]
    from transformers import AutoModelForCausalLM

    expected = direct(backbone.model.double(), AutoModelForCausalLM.from_pretrained(folder_b).double().eval())
    torch.testing.assert_close(torch.tensor(compare["cka"], dtype=torch.float64), expected, rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="`precision='half'` must be 'exact' or 'fast'"):
        CrossModelComparison(folder_b, precision="half")


def test_a_model_against_itself(tmp_path):
    backbone = decoder("gpt2")
    folder = tmp_path / "same"
    backbone.model.save_pretrained(folder)
    callback = CrossModelComparison(str(folder), include_embeddings=True, log_figures=False)
    trainer(tmp_path, [callback]).validate(Standard(backbone).double(), padded_loader(), verbose=False)
    compare = read_summary(tmp_path)["compare"]
    assert compare["layers_a"] == [0, 1, 2, 3]
    assert all(abs(compare["cka"][i][i] - 1) < 1e-9 for i in range(4)) and compare["arccos_distance"] < 1e-4


def test_comparison_on_two_processes_equals_one(tmp_path, folder_b, single_thread):
    torch.save(decoder("gpt2").state_dict(), tmp_path / "weights.pt")

    def compare(root, **options):
        model = decoder("gpt2")
        model.load_state_dict(torch.load(tmp_path / "weights.pt"))
        callback = CrossModelComparison(folder_b, log_figures=False)
        trainer(root, [callback], **options).validate(Standard(model).double(), padded_loader(), verbose=False)
        return json.loads(next((root / "layerwise").glob("val_epoch_*.json")).read_text())

    one = compare(tmp_path / "one")
    many = compare(tmp_path / "many", devices=2, strategy="ddp_fork")
    assert one["compare"]["num_tokens"] == many["compare"]["num_tokens"]
    assert_json_close(many, one, atol=1e-9, rtol=1e-9)


def test_compare_command_on_text(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from layerwise.cli import main as cli_main

    folder_b = str(tmp_path / "byte_gpt2")
    config = tiny_config("gpt2", vocab_size=260)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder_b)
    text = tmp_path / "text.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(120)))
    out = tmp_path / "out"
    argv = ["compare", "--model_a", folder_b, "--model_b", folder_b, "--text", str(text), "--tokenizer", "byte"]
    cli_main([*argv, "--block_size", "16", "--max_blocks", "20", "--device", "cpu", "--out", str(out)])
    diagonal = tmp_path / "diagonal"
    cli_main([*argv, "--block_size", "16", "--max_blocks", "8", "--pairs", "diagonal", "--out", str(diagonal)])
    record = json.loads((diagonal / "compare.json").read_text())
    assert record["pairs"] == "diagonal" and record["cka"][1][0] is None and record["arccos_distance"] < 1e-4
    assert (diagonal / "compare_cka.png").stat().st_size > 0
    record = json.loads((out / "compare.json").read_text())
    assert record["num_tokens"] == 20 * 16 and record["layers_a"] == [1, 2, 3]
    assert all(abs(record["cka"][i][i] - 1) < 1e-6 for i in range(3)) and record["arccos_distance"] < 2e-3
    assert (out / "compare_cka.png").stat().st_size > 1000 and "arccos distance" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli_main(["compare", "--model_a", folder_b, "--model_b", folder_b, "--out", str(tmp_path / "never")])
    assert "--text" in capsys.readouterr().err and not (tmp_path / "never").exists()


@pytest.mark.parametrize("mask_padding", [True, False])
def test_compare_models_on_padded_and_unpadded_batches_equals_a_direct_computation(folder_b, mask_padding):
    """The command's path: masks on the host; an all-ones mask is dropped before the forwards, a padded one kept."""
    from transformers import AutoModelForCausalLM

    from layerwise.engines.compare import compare_models

    model_a = decoder("gpt2").model.double().eval()
    model_b = AutoModelForCausalLM.from_pretrained(folder_b).double().eval()
    first = next(iter(padded_loader()))["input_ids"]
    batches = [{"input_ids": first, "attention_mask": torch.ones_like(first)}, *padded_loader()]
    given_a_mask = []
    model_a.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: given_a_mask.append("attention_mask" in kwargs), with_kwargs=True
    )
    results = compare_models(model_a.transformer, model_b.transformer, batches, mask_padding=mask_padding)
    assert given_a_mask == [False, True, True, True]
    features = {"a": [], "b": []}
    for batch in batches:
        for name, model in (("a", model_a), ("b", model_b)):
            outputs = collect_block_outputs(model.transformer.h, lambda model=model, batch=batch: model(**batch))
            stacked = torch.stack([h.detach() for h in outputs])
            mask = batch["attention_mask"].bool()
            features[name].append(stacked[:, mask] if mask_padding else stacked.flatten(1, 2))
    expected = cross_cka(torch.cat(features["a"], 1), torch.cat(features["b"], 1))
    torch.testing.assert_close(results["cka"], expected, rtol=0, atol=1e-10)
    assert results["num_tokens"] == sum(part.shape[1] for part in features["a"])


def test_comparison_states_are_made_on_the_default_device():
    """`compare_models` builds its states inside `with torch.device(...)`: made there, not filled on the host."""
    from layerwise.metrics.compare import CrossModelCKA

    with torch.device("meta"):
        metric = CrossModelCKA(2, 4, 3, 5)
    assert {getattr(metric, name).device.type for name in metric.sum_state_names} == {"meta"}
    assert CrossModelCKA(2, 4, 3, 5).cross.device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the side stream of the updates is CUDA's")
@pytest.mark.parametrize(
    "dtype, precision, tolerance", [(torch.float64, "exact", 1e-12), (torch.float32, "fast", 1e-5)]
)
def test_compare_models_on_cuda_updates_beside_the_forwards_and_equals_the_cpu_result(
    folder_b, monkeypatch, dtype, precision, tolerance
):
    """On CUDA every update runs on the side stream, after the forwards that made its features: same CKA as on CPU."""
    from transformers import AutoModelForCausalLM

    from layerwise.engines.compare import compare_models
    from layerwise.metrics.compare import CrossModelCKA

    model_a = decoder("gpt2").model.to(dtype).eval()
    model_b = AutoModelForCausalLM.from_pretrained(folder_b).to(dtype).eval()
    first = next(iter(padded_loader()))["input_ids"]
    batches = [{"input_ids": first, "attention_mask": torch.ones_like(first)}, *padded_loader()] * 3
    on_cpu = compare_models(
        model_a.transformer, model_b.transformer, batches, minibatch=True, chunk=8, precision=precision
    )
    streams = []
    update = CrossModelCKA.update

    def spied(self, a, b):
        streams.append(torch.cuda.current_stream())
        return update(self, a, b)

    monkeypatch.setattr(CrossModelCKA, "update", spied)
    on_gpu = compare_models(
        model_a.transformer.cuda(), model_b.transformer.cuda(), batches, minibatch=True, chunk=8, precision=precision
    )
    assert len(streams) == len(batches) and torch.cuda.default_stream() not in streams
    assert on_gpu["num_tokens"] == on_cpu["num_tokens"]
    for key in ("cka", "minibatch_cka_mean", "minibatch_cka_sum"):
        torch.testing.assert_close(on_gpu[key].cpu(), on_cpu[key], rtol=0, atol=tolerance)
