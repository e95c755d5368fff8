"""The one layer-access table: every family's tiny model, its blocks, its head, truncation and hooks."""

import pytest
import torch
from tiny_models import CONFIGS, DEPTH, ENCODER_FAMILIES, tiny_inputs, tiny_model
from torch import nn
from transformers.utils import logging as hf_logging

from layerwise.features import FAMILIES, HookTap, collect_block_outputs, find_layer_paths, hooked_blocks
from layerwise.features.hooks import hook_paths
from layerwise.features.paths import TIMM_VIT, HeadSteps, LayerPaths, get_blocks, layer_paths
from layerwise.features.pooling import pool_tokens
from layerwise.features.truncate import truncated, truncated_copy

hf_logging.set_verbosity_error()

# (family, task) pairs the table claims; each is built from tiny_models.
CASES = [(family, "sequence_classification") for family in CONFIGS if family in ENCODER_FAMILIES] + [
    (family, task)
    for family in CONFIGS
    if family not in ENCODER_FAMILIES
    for task in ("causal_lm", "sequence_classification")
]
CASES += [(family, "base") for family in CONFIGS] + [(TIMM_VIT, "cls"), (TIMM_VIT, "mean")]


def output_of(model: nn.Module, batch: dict, task: str) -> torch.Tensor:
    if "x" in batch:
        return model(batch["x"])
    output = model(**batch)
    return output.last_hidden_state if task == "base" else output.logits


def test_every_family_of_the_table_is_tested_here():
    """A family added to layerwise.features.paths.FAMILIES needs its tiny model in tests/tiny_models.py's CONFIGS."""
    assert set(FAMILIES) == set(CONFIGS) | {TIMM_VIT}


@pytest.mark.parametrize(("family", "task"), CASES, ids=[f"{f}-{t}" for f, t in CASES])
def test_paths_blocks_head_and_truncation(family: str, task: str):
    model = tiny_model(family, task)
    paths = layer_paths(model)
    assert paths.family == family
    blocks = get_blocks(model, paths)
    assert len(blocks) == DEPTH
    assert paths.embeddings is not None and isinstance(model.get_submodule(paths.embeddings), nn.Module)
    batch = tiny_inputs(family)
    with torch.no_grad():
        full = output_of(model, batch, task)
        hidden = collect_block_outputs(blocks, lambda: output_of(model, batch, task))
    head = HeadSteps(model, paths.shared_head)

    def read(h: torch.Tensor) -> torch.Tensor:
        """What the model's own output is at layer d: pooled for classifiers, every token otherwise."""
        if paths.pooling == "tokens":
            return head(h)
        return head(pool_tokens(h, paths.pooling, paths.num_prefix_tokens, batch.get("attention_mask")))

    with torch.no_grad():
        torch.testing.assert_close(read(hidden[-1]), full, rtol=0, atol=1e-5)  # the table's head is the model's own
        for depth in range(1, DEPTH):
            with truncated(model, depth):
                assert len(get_blocks(model, paths)) == depth
                cut = output_of(model, batch, task)
            expected = read(hidden[depth - 1])
            torch.testing.assert_close(cut, expected, rtol=0, atol=1e-5)
            assert not torch.allclose(expected, full, atol=1e-4), "layer d must differ from the last, else vacuous"
            copy = truncated_copy(model, depth)
            assert len(get_blocks(copy, layer_paths(copy))) == depth
            torch.testing.assert_close(output_of(copy, batch, task), expected, rtol=0, atol=1e-5)
    assert len(get_blocks(model, paths)) == DEPTH
    with torch.no_grad():
        torch.testing.assert_close(output_of(model, batch, task), full, rtol=0, atol=0)  # restored


@pytest.mark.parametrize("family", ["gpt2", "bert", TIMM_VIT])
def test_hooks_and_truncation_are_undone_after_an_exception(family: str):
    task = {"gpt2": "causal_lm", "bert": "sequence_classification", TIMM_VIT: "cls"}[family]
    model = tiny_model(family, task)
    paths = layer_paths(model)
    blocks = get_blocks(model, paths)

    def hook_counts() -> list[int]:
        return [len(block._forward_hooks) + len(block._forward_pre_hooks) for block in blocks]

    before = hook_counts()
    seen = []
    with (
        pytest.raises(RuntimeError, match="boom"),
        hooked_blocks(blocks, on_output=lambda i, h: seen.append(i), on_input=lambda i, h: seen.append(-i)),
    ):
        assert hook_counts() == [count + 2 for count in before]
        output_of(model, tiny_inputs(family), task)
        raise RuntimeError("boom")
    assert hook_counts() == before and len(seen) == 2 * DEPTH
    tap = HookTap(model, hook_paths(model, pooling="last" if family == "gpt2" else None))
    with pytest.raises(RuntimeError, match="boom"), tap.attached():
        raise RuntimeError("boom")
    assert hook_counts() == before
    with pytest.raises(RuntimeError, match="boom"), truncated(model, 1):
        raise RuntimeError("boom")
    assert get_blocks(model, paths) is blocks and len(blocks) == DEPTH
    config = getattr(model, "config", None)
    assert config is None or config.num_hidden_layers == DEPTH


def test_a_model_inside_a_module_is_found_with_prefixed_paths():
    holder = nn.Module()
    holder.net = tiny_model("llama", "causal_lm")
    paths = find_layer_paths(holder)
    assert paths.blocks == "net.model.layers" and paths.shared_head == ("net.model.norm", "net.lm_head")
    assert len(get_blocks(holder, paths)) == DEPTH


def test_user_given_paths_reach_any_model():
    model = nn.Module()
    model.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(DEPTH))
    model.out = nn.Linear(4, 2)
    paths = LayerPaths("layers", head=("out",), pooling="cls")
    assert len(get_blocks(model, paths)) == DEPTH and HeadSteps(model, paths.shared_head).modules() == [model.out]
    x = torch.randn(2, 4)

    def run() -> torch.Tensor:
        h = x
        for layer in get_blocks(model, paths):
            h = layer(h)
        return h

    outputs = collect_block_outputs(get_blocks(model, paths), run)
    assert len(outputs) == DEPTH
    with truncated(model, 2, paths):
        torch.testing.assert_close(run(), outputs[1])


def test_unknown_models_get_an_error_naming_the_table_and_the_option():
    with pytest.raises(ValueError, match=r"--model.*FAMILIES in layerwise/features/paths.py"):
        layer_paths(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="Give the dotted paths"):
        find_layer_paths(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="--depth=4.*1..3"):
        truncated_copy(tiny_model("gpt2", "causal_lm"), 4)
