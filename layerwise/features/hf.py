"""Hugging Face transformers: building a model, and where its blocks, final norm and head are.

One table per task (tuned-lens style) maps ``config.model_type`` to dotted paths. A head is a sequence of steps,
each a dotted path of a submodule or one of the activations ``"<tanh>"``/``"<relu>"`` (some heads apply them as
functions, not modules). Heads are never registered as new submodules: they call the model's own modules, so the
state dict and the parameter count stay those of the model.
"""

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor, nn

TANH = "<tanh>"
RELU = "<relu>"
_ACTIVATIONS = {TANH: torch.tanh, RELU: torch.relu}


@dataclass(frozen=True)
class HFPaths:
    """Dotted paths, relative to the model, of the block list and the shared head.

    ``head`` is applied in order to a feature ``(..., d)`` of any layer; for encoders it is the pooler (where the
    model has one) plus the classifier, for causal LMs the final norm plus the LM head.
    """

    blocks: str
    head: tuple[str, ...]


# Sequence classification: h_l is the first-token ([CLS]) output of block l; no final norm (post-LN blocks).
ENCODER_PATHS: dict[str, HFPaths] = {
    "bert": HFPaths("bert.encoder.layer", ("bert.pooler.dense", "bert.pooler.activation", "dropout", "classifier")),
    "roberta": HFPaths(
        "roberta.encoder.layer",
        ("classifier.dropout", "classifier.dense", TANH, "classifier.dropout", "classifier.out_proj"),
    ),
    "xlm-roberta": HFPaths(
        "roberta.encoder.layer",
        ("classifier.dropout", "classifier.dense", TANH, "classifier.dropout", "classifier.out_proj"),
    ),
    "distilbert": HFPaths("distilbert.transformer.layer", ("pre_classifier", RELU, "dropout", "classifier")),
}

# Causal LMs: h_l is the residual stream after block l at every position; the head is the final norm + LM head.
_DECODER = HFPaths("model.layers", ("model.norm", "lm_head"))
CAUSAL_LM_PATHS: dict[str, HFPaths] = {
    "gpt2": HFPaths("transformer.h", ("transformer.ln_f", "lm_head")),
    "llama": _DECODER,
    "mistral": _DECODER,
    "qwen2": _DECODER,
    "qwen3": _DECODER,
    "gpt_neox": HFPaths("gpt_neox.layers", ("gpt_neox.final_layer_norm", "lm_head")),
}


def build_model(
    auto_class: Any,
    model_name_or_path: Optional[str],
    model_type: Optional[str],
    pretrained: bool,
    config_overrides: Optional[dict[str, Any]],
    option: str,
    **config_kwargs: Any,
) -> nn.Module:
    """Build an ``auto_class`` model from a hub name / local path, or from ``model_type`` alone (offline, random).

    ``pretrained=False`` with a name builds the named architecture with random weights (its config is still read);
    ``model_type`` without a name builds ``AutoConfig.for_model(model_type, **config_overrides)``.
    """
    from transformers import AutoConfig

    overrides = {**(config_overrides or {}), **config_kwargs}
    if model_name_or_path is None:
        if model_type is None:
            raise ValueError(f"Give `{option}.model_name_or_path` (hub name or local path) or `{option}.model_type`.")
        return auto_class.from_config(AutoConfig.for_model(model_type, **overrides))
    try:
        if pretrained:
            return auto_class.from_pretrained(model_name_or_path, **overrides)
        config = AutoConfig.from_pretrained(model_name_or_path, **overrides)
    except OSError as error:
        raise ValueError(
            f"`{option}.model_name_or_path={model_name_or_path!r}` could not be loaded ({error}). Offline, give a "
            f"local folder, or `{option}.model_type` with `{option}.config_overrides` to build a model from scratch."
        ) from None
    return auto_class.from_config(config)


def resolve_paths(model: nn.Module, table: dict[str, HFPaths], option: str) -> HFPaths:
    """The table entry of ``model.config.model_type``, with an error naming the option when it is unknown."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in table:
        close = difflib.get_close_matches(str(model_type), list(table), n=3, cutoff=0.5)
        raise ValueError(
            f"`{option}`: layerwise does not know the blocks and head of model type {model_type!r} (known: "
            f"{sorted(table)}; similar: {close}). Add an entry to the path table in layerwise/features/hf.py."
        )
    return table[model_type]


class HeadSteps:
    """The shared head as a callable over the model's own modules (not registered as submodules)."""

    def __init__(self, model: nn.Module, steps: Sequence[str], option: str) -> None:
        self.steps: list[Any] = []
        for step in steps:
            if step in _ACTIVATIONS:
                self.steps.append(_ACTIVATIONS[step])
                continue
            try:
                self.steps.append(model.get_submodule(step))
            except AttributeError:
                raise ValueError(f"`{option}`: {type(model).__name__} has no submodule {step!r}.") from None

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


def block_output(output: Any) -> Tensor:
    """The hidden states a block returns (a tensor, or the first element of a tuple in older transformers)."""
    return output[0] if isinstance(output, (tuple, list)) else output


class HFBackbone(nn.Module):
    """Shared plumbing of the Hugging Face taps: the model, its blocks, its head, block outputs via hooks.

    Hooks are attached for the duration of one forward pass only (they never outlive it, also on error), so the
    module deep-copies, pickles and exports like the plain model.
    """

    def __init__(self, model: nn.Module, table: dict[str, HFPaths], option: str) -> None:
        super().__init__()
        self.model = model
        self.paths = resolve_paths(model, table, option)
        blocks = model.get_submodule(self.paths.blocks)
        if not isinstance(blocks, (nn.ModuleList, nn.Sequential)):
            raise ValueError(f"`{option}`: {self.paths.blocks!r} is not a ModuleList of blocks.")
        self._option = option
        self.num_layers = len(blocks)
        self.embed_dim = int(model.config.hidden_size)

    @property
    def blocks(self) -> nn.ModuleList:
        """The model's block list."""
        return self.model.get_submodule(self.paths.blocks)

    @property
    def head_steps(self) -> HeadSteps:
        """The shared head over the model's own modules."""
        return HeadSteps(self.model, self.paths.head, self._option)

    def run_collecting(self, run: Any) -> list[Tensor]:
        """Call ``run()`` (one forward pass of the model) and return every block's output, in block order."""
        outputs: list[Tensor] = []
        handles = [
            block.register_forward_hook(lambda module, args, output: outputs.append(block_output(output)))
            for block in self.blocks
        ]
        try:
            run()
        finally:
            for handle in handles:
                handle.remove()
        if len(outputs) != self.num_layers:
            raise RuntimeError(f"Expected one output from each of the {self.num_layers} blocks, got {len(outputs)}.")
        return outputs

    def head(self, h: Tensor) -> Tensor:
        """The model's own shared head, applied to features ``(..., d)``."""
        return self.head_steps(h)

    def head_modules(self) -> nn.Module:
        """A fresh, trainable copy of the shared head."""
        return self.head_steps.copy()
