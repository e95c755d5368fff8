"""Big-model analysis without training: a model spread by ``device_map`` over the CPU and the disk (accelerate's
offload, weights on the meta device between calls) gives the same lens, coupling and comparison as in one piece."""

import json

import pytest
import torch
from tiny_models import tiny_config
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from layerwise.cli import main

pytest.importorskip("accelerate")
hf_logging.set_verbosity_error()
# block 1, the final norm and the LM head offloaded to disk; the rest on the CPU
SPLIT = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.layers.2": "cpu",
    "model.norm": "disk",
    "lm_head": "disk",
}
# the same for the base model that `layerwise compare` loads (AutoModel: no "model." prefix, no LM head)
SPLIT_BASE = {name.removeprefix("model."): device for name, device in SPLIT.items() if name != "lm_head"}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    config = tiny_config(
        "llama", hidden_size=16, num_attention_heads=2, num_key_value_heads=1, intermediate_size=32, vocab_size=260
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def test_offloaded_model_is_really_offloaded(tiny_llama, tmp_path):
    from layerwise.engines.checkpoint import load_model

    model = load_model(str(tiny_llama), "--model", "causal_lm", device_map=SPLIT, offload_folder=tmp_path)
    devices = {name.split(".weight")[0]: str(p.device) for name, p in model.named_parameters()}
    assert devices["lm_head"] == "meta" and devices["model.layers.1.mlp.up_proj"] == "meta"
    assert devices["model.layers.0.mlp.up_proj"] == "cpu"
    with pytest.raises(ValueError, match="offload folder needs a device_map"):
        load_model(str(tiny_llama), "--model", "causal_lm", offload_folder=tmp_path)


def run_both(command, tiny_llama, tmp_path, extra):
    """The command on the model in one piece and split by SPLIT; returns both outputs' folders."""
    outs = {}
    for name, placement in (
        ("whole", []),
        ("split", ["--device_map", json.dumps(SPLIT), "--offload_folder", str(tmp_path / "offload")]),
    ):
        outs[name] = tmp_path / name
        main([command, "--model", str(tiny_llama), *extra, *placement, "--out", str(outs[name])])
    return outs


def test_lens_and_coupling_of_an_offloaded_model_equal_the_whole_model(tiny_llama, tmp_path):
    lens = run_both(
        "lens", tiny_llama, tmp_path / "lens", ["--tokenizer", "byte", "--prompt", "To be or", "--max_new_tokens", "4"]
    )
    assert (lens["whole"] / "lens.md").read_text() == (lens["split"] / "lens.md").read_text()

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the first prompt of some words\nand a second one here\n")
    extra = ["--tokenizer", "byte", "--prompts", str(prompts), "--ks", "2", "4", "--max_tokens", "12"]
    coupling = run_both("coupling", tiny_llama, tmp_path / "coupling", extra)
    whole, split = (json.loads((coupling[name] / "coupling.json").read_text()) for name in ("whole", "split"))
    for key in ("depth_coupling", "coupling_score", "sigma", "linearisation_cosine", "trajectory_lss"):
        torch.testing.assert_close(torch.tensor(split[key]), torch.tensor(whole[key]), rtol=1e-6, atol=1e-9, msg=key)


def test_compare_of_offloaded_models_equals_the_whole_models(tiny_llama, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("Some plain words of text for the held out blocks, repeated. " * 40)
    extra = [
        "--model_b",
        str(tiny_llama),
        "--text",
        str(text),
        "--tokenizer",
        "byte",
        "--block_size",
        "16",
        "--max_blocks",
        "4",
    ]
    outs = {}
    for name, placement in (
        ("whole", []),
        ("split", ["--device_map", json.dumps(SPLIT_BASE), "--offload_folder", str(tmp_path / "offload")]),
    ):
        outs[name] = tmp_path / name
        main(["compare", "--model_a", str(tiny_llama), *extra, *placement, "--out", str(outs[name])])
    whole, split = (json.loads((outs[name] / "compare.json").read_text()) for name in ("whole", "split"))
    torch.testing.assert_close(torch.tensor(split["cka"]), torch.tensor(whole["cka"]), rtol=0, atol=1e-9)
