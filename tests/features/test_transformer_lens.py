"""Legacy TransformerLens checkpoints (NeelNanda's GeLU / SoLU models) read as GPT-2.

The test writes checkpoints in the real format (a TransformerLens ``config.json`` without ``model_type`` and a
``model_final.pth`` of ``HookedTransformer`` parameters) and checks the converted GPT-2 against an independent float64
implementation of TransformerLens's forward written here from its parameter conventions.
"""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from layerwise.cli import main as cli_main
from layerwise.engines.checkpoint import load_model
from layerwise.features import collect_block_outputs
from layerwise.features.paths import get_blocks, layer_paths
from layerwise.features.transformer_lens import SoLULN
from layerwise.hub import legacy_config

LAYERS, D, HEADS, D_HEAD, D_MLP, VOCAB, CTX = 2, 24, 3, 8, 40, 300, 64


def tl_config(act_fn: str, **changes) -> dict:
    """A config.json as NeelNanda's repos hold it (no model_type)."""
    config = {
        "n_layers": LAYERS,
        "d_model": D,
        "d_mlp": D_MLP,
        "d_head": D_HEAD,
        "n_heads": HEADS,
        "n_ctx": CTX,
        "d_vocab": VOCAB,
        "act_fn": act_fn,
        "attn_only": False,
        "normalization": "LN",
        "tokenizer_name": "NeelNanda/gpt-neox-tokenizer-digits",
        "shortformer_pos": False,
        "seed": 0,
    }
    return {**config, **changes}


def tl_state(act_fn: str, seed: int, unembed_bias: bool = True) -> dict:
    """Random HookedTransformer parameters with TransformerLens's names and shapes (norms not at 1 and 0)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.3):
        return torch.randn(*shape, generator=g) * scale

    state = {"embed.W_E": r(VOCAB, D), "pos_embed.W_pos": r(CTX, D)}
    for layer in range(LAYERS):
        p = f"blocks.{layer}"
        for norm in ("ln1", "ln2"):
            state[f"{p}.{norm}.w"], state[f"{p}.{norm}.b"] = 1 + r(D, scale=0.2), r(D, scale=0.1)
        for name in "QKV":
            state[f"{p}.attn.W_{name}"], state[f"{p}.attn.b_{name}"] = r(HEADS, D, D_HEAD), r(HEADS, D_HEAD, scale=0.1)
        state[f"{p}.attn.W_O"], state[f"{p}.attn.b_O"] = r(HEADS, D_HEAD, D), r(D, scale=0.1)
        state[f"{p}.attn.mask"] = torch.tril(torch.ones(CTX, CTX)).bool()  # buffers TransformerLens saves too
        state[f"{p}.attn.IGNORE"] = torch.tensor(-1e5)
        state[f"{p}.mlp.W_in"], state[f"{p}.mlp.b_in"] = r(D, D_MLP), r(D_MLP, scale=0.1)
        state[f"{p}.mlp.W_out"], state[f"{p}.mlp.b_out"] = r(D_MLP, D), r(D, scale=0.1)
        if act_fn == "solu_ln":
            state[f"{p}.mlp.ln.w"], state[f"{p}.mlp.ln.b"] = 1 + r(D_MLP, scale=0.2), r(D_MLP, scale=0.1)
    state["ln_final.w"], state["ln_final.b"] = 1 + r(D, scale=0.2), r(D, scale=0.1)
    state["unembed.W_U"] = r(D, VOCAB)
    state["unembed.b_U"] = r(VOCAB, scale=0.1) if unembed_bias else torch.zeros(VOCAB)
    return state


def write_checkpoint(folder, act_fn: str, seed: int = 0, **changes):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(tl_config(act_fn, **changes)))
    torch.save(tl_state(act_fn, seed), folder / "model_final.pth")
    return folder


def reference(state: dict, act_fn: str, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """TransformerLens's forward in float64, written from its conventions: logits and the residual after each block."""
    s = {key: value.double() for key, value in state.items()}

    def ln(x, prefix):
        x = x - x.mean(-1, keepdim=True)
        return x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * s[f"{prefix}.w"] + s[f"{prefix}.b"]

    T = tokens.shape[1]
    resid = s["embed.W_E"][tokens] + s["pos_embed.W_pos"][:T]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    residuals = []
    for layer in range(LAYERS):
        p = f"blocks.{layer}"
        x = ln(resid, f"{p}.ln1")
        q, k, v = (torch.einsum("btd,hde->bthe", x, s[f"{p}.attn.W_{n}"]) + s[f"{p}.attn.b_{n}"] for n in "QKV")
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(D_HEAD)
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)
        resid = resid + torch.einsum("bqhe,hed->bqd", z, s[f"{p}.attn.W_O"]) + s[f"{p}.attn.b_O"]
        pre = ln(resid, f"{p}.ln2") @ s[f"{p}.mlp.W_in"] + s[f"{p}.mlp.b_in"]
        post = F.gelu(pre) if act_fn == "gelu" else ln(pre * pre.softmax(-1), f"{p}.mlp.ln")
        resid = resid + post @ s[f"{p}.mlp.W_out"] + s[f"{p}.mlp.b_out"]
        residuals.append(resid)
    return ln(resid, "ln_final") @ s["unembed.W_U"] + s["unembed.b_U"], residuals


@pytest.mark.parametrize("act_fn", ["gelu", "solu_ln"])
def test_transformer_lens_checkpoint_equals_the_reference(tmp_path, act_fn):
    folder = write_checkpoint(tmp_path / act_fn, act_fn)
    model = load_model(str(folder), "--model_a", "causal_lm").double()
    assert type(model).__name__ == "GPT2LMHeadModel" and not model.training
    assert isinstance(model.transformer.h[0].mlp.act, SoLULN) == (act_fn == "solu_ln")
    assert model.config.activation_function == ("solu_ln" if act_fn == "solu_ln" else "gelu")
    tokens = torch.randint(0, VOCAB, (3, 11), generator=torch.Generator().manual_seed(1))
    logits, residuals = reference(tl_state(act_fn, 0), act_fn, tokens)
    paths = layer_paths(model)
    blocks = collect_block_outputs(get_blocks(model, paths), lambda: model(input_ids=tokens))
    torch.testing.assert_close(model(input_ids=tokens).logits, logits, rtol=0, atol=1e-10)
    for ours, theirs in zip(blocks, residuals):  # the layer table reaches TransformerLens's residual stream
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)
    base = load_model(str(folder), "--model_b", "base")
    assert type(base).__name__ == "GPT2Model"


def test_transformer_lens_detection_and_refusals(tmp_path):
    hf_folder = tmp_path / "hf"
    hf_folder.mkdir()
    (hf_folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert legacy_config(str(hf_folder)) is None and legacy_config("gpt2") is None
    assert legacy_config(str(write_checkpoint(tmp_path / "tl", "gelu")))["act_fn"] == "gelu"
    attn_only = write_checkpoint(tmp_path / "attn_only", "gelu", attn_only=True)
    with pytest.raises(ValueError, match="`--model_a`.*attn_only"):
        load_model(str(attn_only), "--model_a", "causal_lm")
    with pytest.raises(ValueError, match="no AutoModelForSequenceClassification"):
        load_model(str(tmp_path / "tl"), "--model_a", "classification")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps(tl_config("gelu")))
    with pytest.raises(ValueError, match="no '\\*final.pth'"):
        load_model(str(tmp_path / "empty"), "--model_a", "causal_lm")
    extra = tmp_path / "extra"
    write_checkpoint(extra, "gelu")
    torch.save({**tl_state("gelu", 0), "blocks.0.attn.W_extra": torch.zeros(2)}, extra / "model_final.pth")
    with pytest.raises(ValueError, match="no place for.*W_extra"):
        load_model(str(extra), "--model_a", "causal_lm")


def test_a_transformer_lens_model_brings_its_tokenizer(tmp_path):
    """NeelNanda's repos hold no tokenizer: their config names one (tokenizer_name), which --tokenizer defaults to."""
    from layerwise.commands._options import model_tokenizer

    folder = write_checkpoint(tmp_path / "gelu", "gelu")
    assert model_tokenizer(str(folder)) == "NeelNanda/gpt-neox-tokenizer-digits"
    assert model_tokenizer("gpt2") == "gpt2" and model_tokenizer(None) is None


def test_gelu_and_solu_compare_and_stitch_through_the_commands(tmp_path):
    """The GeLU-vs-SoLU setup end to end: both commands read the TransformerLens folders as any other model."""
    from layerwise.datamodules.tokenizers import byte_tokenizer

    byte_tokenizer().save_pretrained(tmp_path / "tokenizer")  # what the configs' tokenizer_name points to
    gelu = write_checkpoint(tmp_path / "gelu", "gelu", seed=0, tokenizer_name=str(tmp_path / "tokenizer"))
    solu = write_checkpoint(tmp_path / "solu", "solu_ln", seed=1, tokenizer_name=str(tmp_path / "tokenizer"))
    text = tmp_path / "text.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(80)))
    data = ["--text", str(text), "--block_size", "16"]  # no --tokenizer: the checkpoints' own
    cli_main(["compare", "--model_a", str(gelu), "--model_b", str(solu), *data, "--max_blocks", "12",
              "--device", "cpu", "--out", str(tmp_path / "compare")])  # fmt: skip
    record = json.loads((tmp_path / "compare" / "compare.json").read_text())
    cka = torch.tensor(record["cka"])
    assert cka.shape == (LAYERS, LAYERS) and bool(((cka > 0) & (cka < 1)).all())
    cli_main(["stitch", "--model_a", str(solu), "--model_b", str(gelu), *data, "--pairs", "1:1", "--steps", "3",
              "--warmup_steps", "1", "--out", str(tmp_path / "stitch")])  # fmt: skip
    rows = json.loads((tmp_path / "stitch" / "stitch.json").read_text())["rows"]
    assert [(row["layer_a"], row["layer_b"]) for row in rows] == [(1, 1)]
    assert math.isfinite(rows[0]["penalty_b"]) and rows[0]["loss_a"] != rows[0]["loss_b"]
