"""Tiny real models of every family of the layer-access table, built offline from their configs (sizes asserted).

``CONFIGS`` holds one entry per Hugging Face family of :data:`layerwise.features.paths.FAMILIES` (the timm ViT is built
by ``tiny_model`` itself); ``tests/features/test_layer_paths.py`` fails when a family of the table has none here.
``tiny_config(family, **overrides)`` is that family's config with a test's own values on top: a test that needs other
sizes passes them, so every test keeps the numbers it was written with; ``tiny_overrides`` is the same as a dict, for
the ``config_overrides`` option of layerwise's Hugging Face backbones. ``decoder``/``encoder`` are the tiny language
model backbones (layerwise's ``HFCausalLM``/``HFEncoder``) that the language-model, comparison and coupling tests share.
"""

import timm
import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    PretrainedConfig,
)
from transformers.utils import logging as hf_logging

from layerwise.features import HFCausalLM, HFEncoder
from layerwise.features.paths import TIMM_VIT

hf_logging.set_verbosity_error()

# ------------------------------------------------------------------------------ the table: one tiny model per family

DEPTH, WIDTH, VOCAB, LABELS = 3, 32, 96, 3
_SIZES = dict(
    num_hidden_layers=DEPTH, hidden_size=WIDTH, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64
)
CONFIGS = {
    "bert": _SIZES,
    "roberta": _SIZES,
    "xlm-roberta": _SIZES,
    "distilbert": dict(n_layers=DEPTH, dim=WIDTH, n_heads=4, hidden_dim=64, max_position_embeddings=64),
    "gpt2": dict(n_layer=DEPTH, n_embd=WIDTH, n_head=4, n_positions=64),
    "gpt_neox": _SIZES,
    "llama": dict(_SIZES, num_key_value_heads=2),
    "mistral": dict(_SIZES, num_key_value_heads=2),
    "qwen2": dict(_SIZES, num_key_value_heads=2),
    "qwen3": dict(_SIZES, num_key_value_heads=2, head_dim=8),
    "opt": dict(_SIZES, ffn_dim=64, word_embed_proj_dim=WIDTH),
}
ENCODER_FAMILIES = ("bert", "roberta", "xlm-roberta", "distilbert")


def tiny_overrides(family: str, **overrides) -> dict:
    """``CONFIGS[family]`` with ``overrides`` on top: the ``config_overrides`` of ``HFEncoder``/``HFCausalLM``."""
    return {**CONFIGS[family], **overrides}


def tiny_config(family: str, **overrides) -> PretrainedConfig:
    """The family's tiny config of ``CONFIGS``, with ``overrides`` (a test's own sizes and ids) on top."""
    return AutoConfig.for_model(family, **tiny_overrides(family, **overrides))


def tiny_model(family: str, task: str = "base") -> nn.Module:
    """The table's model of ``family`` for ``task`` (base, causal_lm, sequence_classification; cls/mean for timm)."""
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
    config = tiny_config(family, vocab_size=VOCAB, pad_token_id=0, num_labels=LABELS)
    auto = {
        "base": AutoModel,
        "causal_lm": AutoModelForCausalLM,
        "sequence_classification": AutoModelForSequenceClassification,
    }[task]
    model = auto.from_config(config).eval()
    assert config.num_hidden_layers == DEPTH
    return model


def tiny_inputs(family: str) -> dict:
    """Two inputs for ``tiny_model(family)``: images for the timm ViT, 6 token ids (no padding) otherwise."""
    if family == TIMM_VIT:
        return {"x": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))}
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


# ------------------------------------------------------------------------------ layerwise's language-model backbones

LM_LAYERS, LM_WIDTH, LM_VOCAB = 3, 32, 97

ENCODERS = {
    "bert": dict(
        num_hidden_layers=LM_LAYERS,
        hidden_size=LM_WIDTH,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=LM_VOCAB,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    ),
    "roberta": dict(
        num_hidden_layers=LM_LAYERS,
        hidden_size=LM_WIDTH,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=LM_VOCAB,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=1,
    ),
    "distilbert": dict(n_layers=LM_LAYERS, dim=LM_WIDTH, n_heads=2, hidden_dim=64, vocab_size=LM_VOCAB, dropout=0.0),
}
DECODERS = {
    "gpt2": dict(
        n_layer=LM_LAYERS,
        n_embd=LM_WIDTH,
        n_head=2,
        vocab_size=LM_VOCAB,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    ),
    "llama": dict(
        num_hidden_layers=LM_LAYERS,
        hidden_size=LM_WIDTH,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        vocab_size=LM_VOCAB,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
    ),
}


def encoder(model_type: str, num_classes: int = 2, seed: int = 0) -> HFEncoder:
    """A float64 ``HFEncoder`` of ``ENCODERS[model_type]`` (LM_LAYERS layers of width LM_WIDTH), in eval mode."""
    torch.manual_seed(seed)
    backbone = HFEncoder(model_type=model_type, num_classes=num_classes, config_overrides=ENCODERS[model_type])
    assert (backbone.num_layers, backbone.embed_dim, backbone.num_classes) == (LM_LAYERS, LM_WIDTH, num_classes)
    return backbone.double().eval()


def decoder(model_type: str, seed: int = 0) -> HFCausalLM:
    """A float64 ``HFCausalLM`` of ``DECODERS[model_type]`` (LM_LAYERS layers, vocabulary LM_VOCAB), in eval mode."""
    torch.manual_seed(seed)
    backbone = HFCausalLM(model_type=model_type, config_overrides=DECODERS[model_type])
    assert (backbone.num_layers, backbone.embed_dim, backbone.num_classes) == (LM_LAYERS, LM_WIDTH, LM_VOCAB)
    return backbone.double().eval()


def lm_loader(num_sequences: int = 7, length: int = 9, batch_size: int = 3) -> DataLoader:
    """Random token sequences for ``decoder`` (ids from 2, no padding)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(2, LM_VOCAB, (num_sequences, length), generator=generator)
    rows = [{"input_ids": row, "attention_mask": torch.ones_like(row)} for row in ids]
    return DataLoader(rows, batch_size=batch_size)
