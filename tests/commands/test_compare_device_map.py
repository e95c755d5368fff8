"""``layerwise compare --device_map`` takes the base model's module names or the causal LM's."""

import json

import pytest
from test_device_map import SPLIT, SPLIT_BASE, tiny_llama  # noqa: F401 (a fixture)
from tiny_models import tiny_config
from transformers import AutoModelForCausalLM

from layerwise.cli import main
from layerwise.commands.compare import base_device_map

pytest.importorskip("accelerate")


def compare(tiny_llama, tmp_path, name, device_map):  # noqa: F811
    text = tmp_path / "text.txt"
    text.write_text("Some plain words of text for the held out blocks, repeated. " * 40)
    out = tmp_path / name
    argv = ["compare", "--model_a", str(tiny_llama), "--model_b", str(tiny_llama), "--text", str(text)]
    argv += ["--tokenizer", "byte", "--block_size", "16", "--max_blocks", "4", "--out", str(out)]
    main([*argv, "--device_map", json.dumps(device_map), "--offload_folder", str(tmp_path / f"offload_{name}")])
    return json.loads((out / "compare.json").read_text())


def test_compare_takes_the_causal_lm_names_of_lens_and_coupling(tiny_llama, tmp_path):  # noqa: F811
    causal = compare(tiny_llama, tmp_path, "causal", SPLIT)  # 'model.layers.1': 'disk', 'lm_head': 'disk', ...
    base = compare(tiny_llama, tmp_path, "base", SPLIT_BASE)
    assert causal["cka"] == base["cka"] and causal["num_tokens"] == base["num_tokens"] == 64


def test_base_device_map_translates_only_prefixed_names(tmp_path):
    folder = tmp_path / "gpt2"
    config = tiny_config("gpt2", n_layer=2, n_embd=16, n_head=2, vocab_size=260, n_positions=32)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    causal = {"transformer.wte": 0, "transformer.h.0": "cpu", "transformer.h.1": "disk", "lm_head": "disk"}
    assert base_device_map(causal, str(folder)) == {"wte": 0, "h.0": "cpu", "h.1": "disk"}
    assert base_device_map({"transformer": "cpu", "lm_head": 0}, str(folder)) == {"": "cpu"}
    assert base_device_map({"wte": 0, "h": "cpu"}, str(folder)) == {"wte": 0, "h": "cpu"}  # already the base's
    assert base_device_map("auto", str(folder)) == "auto"


def test_an_incomplete_device_map_is_one_line_naming_the_option(tiny_llama, tmp_path, capsys):  # noqa: F811
    partial = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk"}
    with pytest.raises(SystemExit):
        compare(tiny_llama, tmp_path, "partial", partial)
    error = capsys.readouterr().err
    assert "`--device_map` places none of --model_a's layers.2." in error and "'model.layers.0'" in error
    assert not (tmp_path / "partial").exists()
