"""The one layer-access table: every family's tiny model, its blocks, its head, truncation and hooks."""

import pytest
import timm
import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
)
from transformers.utils import logging as hf_logging

from layerwise.features import FAMILIES, HookTap, collect_block_outputs, find_layer_paths, hooked_blocks
from layerwise.features.hooks import hook_paths
from layerwise.features.paths import TIMM_VIT, HeadSteps, LayerPaths, get_blocks, layer_paths
from layerwise.features.pooling import pool_tokens
from layerwise.features.truncate import truncated, truncated_copy

hf_logging.set_verbosity_error()

DEPTH, WIDTH, VOCAB, LABELS = 3, 32, 96, 3
_COMMON = dict(
    num_hidden_layers=DEPTH,
    hidden_size=WIDTH,
    num_attention_heads=4,
    intermediate_size=64,
    vocab_size=VOCAB,
    max_position_embeddings=64,
    pad_token_id=0,
    num_labels=LABELS,
)
CONFIGS = {
    "bert": {},
    "roberta": {},
    "xlm-roberta": {},
    "distilbert": dict(n_layers=DEPTH, dim=WIDTH, n_heads=4, hidden_dim=64),
    "gpt2": dict(n_layer=DEPTH, n_embd=WIDTH, n_head=4, n_positions=64),
    "gpt_neox": {},
    "llama": dict(num_key_value_heads=2),
    "mistral": dict(num_key_value_heads=2),
    "qwen2": dict(num_key_value_heads=2),
    "qwen3": dict(num_key_value_heads=2, head_dim=8),
    "opt": dict(ffn_dim=64, word_embed_proj_dim=WIDTH),
}
ENCODERS = ("bert", "roberta", "xlm-roberta", "distilbert")
# (family, task) pairs the table claims; each is built below.
CASES = [(family, "sequence_classification") for family in CONFIGS if family in ENCODERS] + [
    (family, task) for family in CONFIGS if family not in ENCODERS for task in ("causal_lm", "sequence_classification")
]
CASES += [(family, "base") for family in CONFIGS] + [(TIMM_VIT, "cls"), (TIMM_VIT, "mean")]


def build(family: str, task: str) -> nn.Module:
    torch.manual_seed(0)
    if family == TIMM_VIT:
        model = timm.create_model(
            "vit_tiny_patch16_224",
            img_size=16,
            patch_size=4,
            embed_dim=WIDTH,
            depth=DEPTH,
            num_heads=4,
            num_classes=LABELS,
            global_pool="token" if task == "cls" else "avg",
        )
        assert len(model.blocks) == DEPTH and model.embed_dim == WIDTH
        return model.eval()
    overrides = {**_COMMON, **CONFIGS[family]}
    if family == "distilbert":
        overrides = {
            key: value
            for key, value in overrides.items()
            if key not in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
        }
    config = AutoConfig.for_model(family, **overrides)
    auto = {
        "base": AutoModel,
        "causal_lm": AutoModelForCausalLM,
        "sequence_classification": AutoModelForSequenceClassification,
    }[task]
    model = auto.from_config(config).eval()
    assert config.num_hidden_layers == DEPTH
    return model


def inputs(family: str) -> dict:
    if family == TIMM_VIT:
        return {"x": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))}
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def output_of(model: nn.Module, batch: dict, task: str) -> torch.Tensor:
    if "x" in batch:
        return model(batch["x"])
    output = model(**batch)
    return output.last_hidden_state if task == "base" else output.logits


def test_every_family_of_the_table_is_tested_here():
    assert set(FAMILIES) == set(CONFIGS) | {TIMM_VIT}


@pytest.mark.parametrize(("family", "task"), CASES, ids=[f"{f}-{t}" for f, t in CASES])
def test_paths_blocks_head_and_truncation(family: str, task: str):
    model = build(family, task)
    paths = layer_paths(model)
    assert paths.family == family
    blocks = get_blocks(model, paths)
    assert len(blocks) == DEPTH
    assert paths.embeddings is not None and isinstance(model.get_submodule(paths.embeddings), nn.Module)
    batch = inputs(family)
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
    model = build(family, task)
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
        output_of(model, inputs(family), task)
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
    holder.net = build("llama", "causal_lm")
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
        truncated_copy(build("gpt2", "causal_lm"), 4)
