"""Where the layers of a model live: the one table from model family to its parts.

Every part of layerwise that reaches "layer l" of a model (the backbones, the callbacks' hooks on foreign modules,
the lens, generation, export, early exit) asks this module. Adding a model family is one entry in
:data:`FAMILIES` plus a tiny-model test in ``tests/features/test_layer_paths.py``.

An entry gives, relative to the family's *base model* (Hugging Face ``model.base_model``; the timm model itself),
the input embedding, the block list and the final norm, and per task (``causal_lm``, ``sequence_classification``,
``image_classification``) the head steps relative to the task model. A step is a dotted submodule path, one of the
activations ``"<tanh>"``/``"<relu>"`` that some heads apply as functions, and a trailing ``"?"`` marks a part that
not every model of the family has (OPT's ``project_out``). The *shared head* applied to every layer is the final
norm followed by the task head: the model's own modules, never copies, so state dicts and parameter counts stay
those of the model.
"""

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Optional, Union

import torch
from torch import Tensor, nn

from layerwise.errors import UsageError

TANH = "<tanh>"
RELU = "<relu>"
_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {TANH: torch.tanh, RELU: torch.relu}

Task = Literal["base", "causal_lm", "sequence_classification", "image_classification"]
TIMM_VIT = "timm_vit"


@dataclass(frozen=True)
class Family:
    """The parts of one model family (see the module docstring for the path conventions).

    Attributes:
        embeddings: the input (token or patch) embedding, relative to the base model.
        blocks: the list of transformer blocks, relative to the base model.
        final_norm: steps applied to a block output before any head (``()`` for post-LN encoders).
        heads: task -> head steps, relative to the task model.
        pooling: task -> how one feature per sample is read from a block's tokens (``"tokens"``: every position).
        num_prefix_tokens: leading special tokens that ``mean`` pooling skips.
        branches: the residual branches inside a block (``attention``, ``mlp``), see :class:`Branch`.
    """

    embeddings: str
    blocks: str
    final_norm: tuple[str, ...] = ()
    heads: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    pooling: Mapping[str, str] = field(default_factory=dict)
    num_prefix_tokens: int = 0
    branches: Mapping[str, "Branch"] = field(default_factory=dict)


@dataclass(frozen=True)
class Branch:
    """One residual branch x -> x + F(x) inside a block, by two submodule paths relative to the block.

    Attributes:
        skip: the module called with the residual stream x that the branch adds to, as its positional argument
            ``skip_arg`` (pre-LN: the branch's own norm; post-LN BERT: the output module that adds and normalises).
        out: the module whose output (the first element of a tuple) is F(x), just before the addition (after any
            layer scale; dropout, identity in evaluation, may follow).
        skip_arg: which positional argument of ``skip`` is x.
    """

    skip: str
    out: str
    skip_arg: int = 0


_ROBERTA_HEAD = ("classifier.dropout", "classifier.dense", TANH, "classifier.dropout", "classifier.out_proj")
_DECODER_HEADS = {"causal_lm": ("lm_head",), "sequence_classification": ("score",)}
_DECODER_POOLING = {"causal_lm": "tokens", "sequence_classification": "last", "base": "tokens"}
_ENCODER_POOLING = {"sequence_classification": "cls", "base": "tokens"}


# Pre-LN decoders of the LLaMA line: x + self_attn(input_layernorm(x)), then h + mlp(post_attention_layernorm(h)).
_LLAMA_BRANCHES = {
    "attention": Branch("input_layernorm", "self_attn"),
    "mlp": Branch("post_attention_layernorm", "mlp"),
}
# Post-LN BERT: LayerNorm(x + dense(...)) in BertSelfOutput(hidden, x) and BertOutput(hidden, x): the ratio is taken
# before that LayerNorm, with x the second argument of the output module.
_BERT_BRANCHES = {
    "attention": Branch("attention.output", "attention.output.dense", skip_arg=1),
    "mlp": Branch("output", "output.dense", skip_arg=1),
}


def _decoder(
    embeddings: str, blocks: str, final_norm: tuple[str, ...], branches: Optional[Mapping[str, Branch]] = None
) -> Family:
    """A Hugging Face decoder: its LM head and its sequence-classification score."""
    return Family(embeddings, blocks, final_norm, _DECODER_HEADS, _DECODER_POOLING, branches=branches or {})


def _encoder(
    embeddings: str, blocks: str, head: tuple[str, ...], branches: Optional[Mapping[str, Branch]] = None
) -> Family:
    """A Hugging Face post-LN encoder: no final norm, the classifier ``head`` reading the [CLS] token."""
    heads = {"sequence_classification": head}
    return Family(embeddings, blocks, (), heads, _ENCODER_POOLING, num_prefix_tokens=1, branches=branches or {})


# family -> parts. The one table of where layers live.
FAMILIES: dict[str, Family] = {
    TIMM_VIT: Family(
        "patch_embed",
        "blocks",
        ("norm",),
        {"image_classification": ("fc_norm", "head_drop", "head")},
        {"image_classification": "cls"},
        num_prefix_tokens=1,  # both adapted to the instance in layer_paths
        branches={"attention": Branch("norm1", "ls1"), "mlp": Branch("norm2", "ls2")},
    ),
    "bert": _encoder(
        "embeddings",
        "encoder.layer",
        ("bert.pooler.dense", "bert.pooler.activation", "dropout", "classifier"),
        _BERT_BRANCHES,
    ),
    "roberta": _encoder("embeddings", "encoder.layer", _ROBERTA_HEAD, _BERT_BRANCHES),
    "xlm-roberta": _encoder("embeddings", "encoder.layer", _ROBERTA_HEAD, _BERT_BRANCHES),
    "distilbert": _encoder("embeddings", "transformer.layer", ("pre_classifier", RELU, "dropout", "classifier")),
    "gpt2": _decoder("wte", "h", ("ln_f",), {"attention": Branch("ln_1", "attn"), "mlp": Branch("ln_2", "mlp")}),
    # parallel residual (the default): both norms read the block input x, x + attention(.) + mlp(.)
    "gpt_neox": _decoder(
        "embed_in",
        "layers",
        ("final_layer_norm",),
        {"attention": Branch("input_layernorm", "attention"), "mlp": Branch("post_attention_layernorm", "mlp")},
    ),
    "llama": _decoder("embed_tokens", "layers", ("norm",), _LLAMA_BRANCHES),
    "mistral": _decoder("embed_tokens", "layers", ("norm",), _LLAMA_BRANCHES),
    "qwen2": _decoder("embed_tokens", "layers", ("norm",), _LLAMA_BRANCHES),
    "qwen3": _decoder("embed_tokens", "layers", ("norm",), _LLAMA_BRANCHES),
    "opt": _decoder("decoder.embed_tokens", "decoder.layers", ("decoder.final_layer_norm?", "decoder.project_out?")),
}


@dataclass(frozen=True)
class Tower:
    """One tower of a two-tower model (CLIP), by paths relative to the whole model.

    Attributes:
        module: the tower, called alone on its own inputs.
        blocks: its list of transformer blocks.
        final_norm: the norm applied to a block output before the projection.
        projection: the map into the joint image-text space.
        readout: the token whose feature represents the input (``cls``: position 0; ``eos``: the end of text).
    """

    module: str
    blocks: str
    final_norm: tuple[str, ...]
    projection: str
    readout: Literal["cls", "eos"]


# transformers' CLIPModel (App. D): each tower's blocks, its own final norm and its projection into the joint space.
CLIP_TOWERS: dict[str, Tower] = {
    "vision": Tower(
        "vision_model", "vision_model.encoder.layers", ("vision_model.post_layernorm",), "visual_projection", "cls"
    ),
    "text": Tower(
        "text_model", "text_model.encoder.layers", ("text_model.final_layer_norm",), "text_projection", "eos"
    ),
}


@dataclass(frozen=True)
class LayerPaths:
    """Dotted paths of one model's parts, relative to the module they were resolved against.

    Give them yourself for a model outside :data:`FAMILIES` (``blocks`` and ``head`` at least); otherwise
    :func:`layer_paths` / :func:`find_layer_paths` fill them from the table.
    """

    blocks: str
    head: tuple[str, ...] = ()
    final_norm: tuple[str, ...] = ()
    embeddings: Optional[str] = None
    pooling: str = "cls"
    num_prefix_tokens: int = 1
    family: str = "custom"
    task: str = "custom"
    branches: Mapping[str, Branch] = field(default_factory=dict)

    @property
    def shared_head(self) -> tuple[str, ...]:
        """The steps applied to every layer's feature: final norm, then the task head."""
        return self.final_norm + self.head

    def prefixed(self, prefix: str) -> "LayerPaths":
        """The same paths seen from a module holding this one at ``prefix``."""
        if not prefix:
            return self

        def add(path: str) -> str:
            return path if path in _ACTIVATIONS else f"{prefix}.{path}"

        return replace(
            self,
            blocks=add(self.blocks),
            head=tuple(add(step) for step in self.head),
            final_norm=tuple(add(step) for step in self.final_norm),
            embeddings=None if self.embeddings is None else add(self.embeddings),
        )


def family_of(module: nn.Module) -> Optional[str]:
    """The :data:`FAMILIES` key of ``module`` (a timm ViT or a Hugging Face model), ``None`` when unknown."""
    if type(module).__name__ == "VisionTransformer" and hasattr(module, "forward_intermediates"):
        return TIMM_VIT
    config = getattr(module, "config", None)
    model_type = getattr(config, "model_type", None)
    return model_type if model_type in FAMILIES and hasattr(module, "base_model") else None


def task_of(model: nn.Module) -> Optional[str]:
    """``base``, ``causal_lm``, ``sequence_classification`` or ``image_classification``, from the model's class."""
    if family_of(model) == TIMM_VIT:
        return "image_classification"
    if getattr(model, "base_model", None) is model:
        return "base"
    name = type(model).__name__
    for suffix, task in (
        ("ForCausalLM", "causal_lm"),
        ("LMHeadModel", "causal_lm"),
        ("ForSequenceClassification", "sequence_classification"),
    ):
        if name.endswith(suffix):
            return task
    return None


def layer_paths(model: nn.Module, option: str = "--model") -> LayerPaths:
    """The paths of ``model``'s parts from :data:`FAMILIES`, relative to ``model``.

    Raises:
        ValueError: naming ``option``, when the family or the task of the model is not in the table.
    """
    family_name = family_of(model)
    if family_name is None:
        model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        close = difflib.get_close_matches(str(model_type), list(FAMILIES), n=3, cutoff=0.5)
        raise UsageError(
            f"`{option}`: layerwise does not know where the blocks and head of {type(model).__name__} (model type "
            f"{model_type!r}) are (known families: {sorted(FAMILIES)}; similar: {close}). Add an entry to FAMILIES "
            "in layerwise/features/paths.py, or give the paths yourself (LayerPaths / blocks=, classifier=)."
        )
    family = FAMILIES[family_name]
    task = task_of(model)
    if task is None or (task != "base" and task not in family.heads):
        raise UsageError(
            f"`{option}`: layerwise knows the {family_name!r} family but not the task of {type(model).__name__} "
            f"(known tasks: {sorted(family.heads)} and the base model)."
        )
    base = "" if family_name == TIMM_VIT or task == "base" else model.base_model_prefix
    pooling, prefix_tokens = family.pooling.get(task, "tokens"), family.num_prefix_tokens
    if family_name == TIMM_VIT:
        pooling = "cls" if getattr(model, "global_pool", "token") == "token" else "mean"
        prefix_tokens = int(model.num_prefix_tokens)
    in_base = LayerPaths(blocks=family.blocks, final_norm=family.final_norm, embeddings=family.embeddings).prefixed(
        base
    )
    return LayerPaths(
        blocks=in_base.blocks,
        head=family.heads.get(task, ()),
        final_norm=in_base.final_norm,
        embeddings=in_base.embeddings,
        pooling=pooling,
        num_prefix_tokens=prefix_tokens,
        family=family_name,
        task=task,
        branches=family.branches,
    )


def find_layer_paths(root: nn.Module, option: str = "blocks") -> LayerPaths:
    """The paths of the first known model inside ``root`` (e.g. a LightningModule), relative to ``root``."""
    for prefix, module in root.named_modules():
        if family_of(module) is not None and task_of(module) is not None:
            return layer_paths(module, option).prefixed(prefix)
    raise UsageError(
        f"layerwise found no model of a known family (known: {sorted(FAMILIES)}) inside {type(root).__name__}. "
        "Give the dotted paths relative to it, e.g. `blocks='model.encoder.layers', final_norm='model.norm', "
        "classifier='model.head', pooling='cls'`."
    )


def find_model(root: nn.Module, option: str = "model") -> nn.Module:
    """The first model of a known family inside ``root`` (a LightningModule, or the model itself)."""
    for _, module in root.named_modules():
        if family_of(module) is not None and task_of(module) is not None:
            return module
    raise UsageError(
        f"`{option}`: layerwise found no model of a known family (known: {sorted(FAMILIES)}) inside "
        f"{type(root).__name__}."
    )


def model_width(model: nn.Module) -> int:
    """The residual-stream width d of a table-known model (``config.hidden_size`` or timm's ``embed_dim``)."""
    width = getattr(getattr(model, "config", None), "hidden_size", None) or getattr(model, "embed_dim", None)
    if width is None:
        raise UsageError(f"Cannot read the width of {type(model).__name__} (config.hidden_size or embed_dim).")
    return int(width)


def get_part(root: nn.Module, path: str, option: str) -> Optional[nn.Module]:
    """The submodule at ``path`` (``None`` for a missing optional ``path?``), else a ValueError naming ``option``."""
    optional = path.endswith("?")
    path = path.rstrip("?")
    parent_path, _, name = path.rpartition(".")
    try:
        parent = root.get_submodule(parent_path) if parent_path else root
    except AttributeError:
        parent = None
    module = getattr(parent, name, None)
    if isinstance(module, nn.Module):
        return module
    if optional:
        return None
    raise UsageError(f"`{option}`: {type(root).__name__} has no submodule {path!r}.")


# A backbone's blocks: what get_blocks returns, or any sequence of modules.
Blocks = Union[Sequence[nn.Module], nn.ModuleList, nn.Sequential]


def get_blocks(root: nn.Module, paths: LayerPaths, option: str = "blocks") -> Union[nn.ModuleList, nn.Sequential]:
    """The block list of ``paths``, checked to be a ModuleList/Sequential."""
    blocks = get_part(root, paths.blocks, option)
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        raise UsageError(f"`{option}={paths.blocks!r}` must name a ModuleList/Sequential of transformer blocks.")
    return blocks


class HeadSteps:
    """The shared head (final norm + task head) as a callable over ``root``'s own modules, not registered."""

    def __init__(self, root: nn.Module, steps: Sequence[str], option: str = "classifier") -> None:
        self.steps: list[Any] = []
        for step in steps:
            if step in _ACTIVATIONS:
                self.steps.append(_ACTIVATIONS[step])
                continue
            module = get_part(root, step, option)
            if module is not None:
                self.steps.append(module)

    def __call__(self, h: Tensor) -> Tensor:
        for step in self.steps:
            h = step(h)
        return h

    def modules(self) -> list[nn.Module]:
        """The modules among the steps, in order."""
        return [step for step in self.steps if isinstance(step, nn.Module)]

    def copy(self) -> nn.Module:
        """A fresh, trainable copy of the head as one module, e.g. for a separate exit classifier."""
        import copy

        return _Steps(*[copy.deepcopy(step) if isinstance(step, nn.Module) else _Function(step) for step in self.steps])


class _Function(nn.Module):
    def __init__(self, function: Any) -> None:
        super().__init__()
        self.function = function

    def forward(self, h: Tensor) -> Tensor:
        return self.function(h)


class _Steps(nn.Sequential):
    """A copied head: the same steps as ``HeadSteps``, owning its parameters."""


def num_blocks(model: nn.Module, option: str = "--model") -> int:
    """Number of blocks ``L`` of a model known to :data:`FAMILIES` (``option`` names it in an error)."""
    return len(get_blocks(model, layer_paths(model, option), option))
