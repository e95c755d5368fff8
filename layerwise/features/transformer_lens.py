"""Legacy TransformerLens checkpoints (NeelNanda/GELU_*, NeelNanda/SoLU_*) as Hugging Face GPT-2 models.

The GeLU and SoLU language models that Brown et al. (2023) stitch were trained with TransformerLens and published in
its own format: a ``config.json`` without a ``model_type`` (``d_model``, ``n_layers``, ``act_fn``, ...) and a
``*final.pth`` state dict of ``HookedTransformer`` parameters (``blocks.0.attn.W_Q`` of shape (heads, d, d_head), ...).
Transformers cannot load them, and SoLU has no Hugging Face activation. Their architecture is GPT-2's (pre-LN blocks,
learned positions, a final LayerNorm, an untied unembedding), so this module writes the weights into a
``GPT2LMHeadModel`` and, for SoLU, sets each block's MLP activation to :class:`SoLULN` (x * softmax(x) followed by the
MLP's own LayerNorm, TransformerLens's ``solu_ln``). The result is an ordinary Hugging Face model: the layer table,
hooks, truncation and stitching reach its layers like any GPT-2's.

Only the layouts those models use are accepted (LayerNorm or folded ``LNPre`` blocks, standard positions, an MLP,
d_model = heads * d_head); anything else is refused in one line naming the option.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

# TransformerLens act_fn -> transformers' activation name; "solu_ln" has none: SoLULN replaces the activation module.
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_new", "relu": "relu", "solu_ln": None}


class SoLULN(nn.Module):
    """TransformerLens's ``solu_ln`` MLP activation: LayerNorm(x * softmax(x)), the LayerNorm over the MLP width."""

    def __init__(self, width: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.ln(x * torch.softmax(x, dim=-1))


def _checkpoint_file(spec: str) -> Path:
    path = Path(spec)
    if path.is_dir():
        files = sorted(path.glob("*final.pth"))
        if not files:
            raise ValueError(f"`{spec}` holds a TransformerLens config.json but no '*final.pth' state dict.")
        return files[0]
    from huggingface_hub import HfApi, hf_hub_download

    names = [name for name in HfApi().list_repo_files(spec) if name.endswith("final.pth")]
    if not names:
        raise ValueError(f"The hub repo {spec!r} holds a TransformerLens config.json but no '*final.pth' state dict.")
    return Path(hf_hub_download(spec, names[0]))


def gpt2_config(config: dict[str, Any], option: str) -> Any:
    """The ``GPT2Config`` of a legacy TransformerLens config (refusing layouts GPT-2 cannot express)."""
    from transformers import GPT2Config

    act = str(config["act_fn"]).lower()
    normalization = config.get("normalization", config.get("normalization_type"))
    problems = []
    if act not in ACTIVATIONS:
        problems.append(f"act_fn={act!r} (supported: {sorted(ACTIVATIONS)})")
    if normalization not in ("LN", "LNPre"):
        problems.append(f"normalization={normalization!r} (supported: 'LN', 'LNPre')")
    if config.get("attn_only"):
        problems.append("attn_only=true (no MLP)")
    if config.get("shortformer_pos") or config.get("positional_embedding_type", "standard") != "standard":
        problems.append("non-standard positional embeddings")
    if config.get("final_rms"):
        problems.append("final_rms=true")
    if int(config["n_heads"]) * int(config["d_head"]) != int(config["d_model"]):
        problems.append("n_heads * d_head != d_model")
    if problems:
        raise ValueError(f"`{option}`: this TransformerLens checkpoint cannot be read as GPT-2: {'; '.join(problems)}.")
    gpt2 = GPT2Config(
        vocab_size=int(config["d_vocab"]),
        n_positions=int(config["n_ctx"]),
        n_embd=int(config["d_model"]),
        n_layer=int(config["n_layers"]),
        n_head=int(config["n_heads"]),
        n_inner=int(config["d_mlp"]),
        activation_function=ACTIVATIONS[act] or "gelu_new",  # solu_ln: replaced in build_gpt2
        layer_norm_epsilon=float(config.get("eps", 1e-5)),
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=False,
    )
    gpt2.transformer_lens_tokenizer = config.get("tokenizer_name")
    return gpt2


def build_gpt2(config: dict[str, Any], option: str) -> Any:
    """A randomly initialised ``GPT2LMHeadModel`` with the architecture (and SoLU activations) of ``config``."""
    from transformers import GPT2LMHeadModel

    gpt2 = gpt2_config(config, option)
    model = GPT2LMHeadModel(gpt2)
    if str(config["act_fn"]).lower() == "solu_ln":
        for block in model.transformer.h:
            block.mlp.act = SoLULN(gpt2.n_inner, gpt2.layer_norm_epsilon)
        # the config says what the blocks compute; transformers has no "solu_ln", so rebuilding from it fails loudly
        model.config.activation_function = "solu_ln"
    return model


@torch.no_grad()
def load_state_dict(model: Any, state: dict[str, Tensor], option: str) -> None:
    """Write a TransformerLens ``HookedTransformer`` state dict into ``model`` (from :func:`build_gpt2`)."""
    cfg = model.config
    d, heads = cfg.n_embd, cfg.n_head
    state = {key: value.float() for key, value in state.items() if not key.endswith((".IGNORE", ".mask"))}
    used: set[str] = set()

    def take(key: str) -> Tensor:
        if key not in state:
            raise ValueError(f"`{option}`: the TransformerLens state dict has no {key!r}.")
        used.add(key)
        return state[key]

    def norm(module: nn.LayerNorm, prefix: str) -> None:
        if f"{prefix}.w" in state:  # LN; LNPre (weights folded into the next layer) keeps 1 and 0
            module.weight.copy_(take(f"{prefix}.w"))
            module.bias.copy_(take(f"{prefix}.b"))
        else:
            module.weight.fill_(1.0)
            module.bias.zero_()

    transformer = model.transformer
    transformer.wte.weight.copy_(take("embed.W_E"))
    transformer.wpe.weight.copy_(take("pos_embed.W_pos"))
    for index, block in enumerate(transformer.h):
        prefix = f"blocks.{index}"
        norm(block.ln_1, f"{prefix}.ln1")
        norm(block.ln_2, f"{prefix}.ln2")
        # (heads, d, d_head) -> (d, heads * d_head): GPT-2's Conv1D computes x @ W + b, head h in columns h*d_head...
        qkv = [take(f"{prefix}.attn.W_{name}").permute(1, 0, 2).reshape(d, d) for name in "QKV"]
        block.attn.c_attn.weight.copy_(torch.cat(qkv, dim=1))
        block.attn.c_attn.bias.copy_(torch.cat([take(f"{prefix}.attn.b_{name}").reshape(d) for name in "QKV"]))
        block.attn.c_proj.weight.copy_(take(f"{prefix}.attn.W_O").reshape(heads * (d // heads), d))
        block.attn.c_proj.bias.copy_(take(f"{prefix}.attn.b_O"))
        block.mlp.c_fc.weight.copy_(take(f"{prefix}.mlp.W_in"))
        block.mlp.c_fc.bias.copy_(take(f"{prefix}.mlp.b_in"))
        block.mlp.c_proj.weight.copy_(take(f"{prefix}.mlp.W_out"))
        block.mlp.c_proj.bias.copy_(take(f"{prefix}.mlp.b_out"))
        if isinstance(block.mlp.act, SoLULN):
            norm(block.mlp.act.ln, f"{prefix}.mlp.ln")
    norm(transformer.ln_f, "ln_final")
    unembed = take("unembed.W_U")  # (d, vocab)
    bias = state.get("unembed.b_U")
    if bias is not None:
        used.add("unembed.b_U")
        if bool(bias.ne(0).any()):  # GPT-2's head has no bias: give it one only when the checkpoint has one
            model.lm_head = nn.Linear(d, unembed.shape[1], bias=True, dtype=model.lm_head.weight.dtype)
            model.lm_head.bias.copy_(bias)
    model.lm_head.weight.copy_(unembed.T)
    left = sorted(set(state) - used)
    if left:
        raise ValueError(
            f"`{option}`: the TransformerLens state dict has parameters GPT-2 has no place for: {left[:6]}."
        )


def load_gpt2(spec: str, config: dict[str, Any], option: str, pretrained: bool = True, dtype: Any = None) -> Any:
    """The legacy TransformerLens model at ``spec`` (folder or hub id) as a ``GPT2LMHeadModel`` in eval mode."""
    model = build_gpt2(config, option)
    if pretrained:
        state = torch.load(_checkpoint_file(spec), map_location="cpu", weights_only=True)
        load_state_dict(model, state, option)
    if dtype is not None:
        model = model.to(dtype)
    model.config.name_or_path = str(spec)
    return model.eval()
