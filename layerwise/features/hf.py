"""Hugging Face transformers: building a model (the one hub wrapper) and the plumbing the HF backbones share.

Where a model's blocks, final norm and head are comes from :mod:`layerwise.features.paths`.
"""

from typing import Any, Optional, Union, cast

import torch
from torch import Tensor, nn

from layerwise.features import transformer_lens
from layerwise.features.hooks import collect_block_outputs
from layerwise.features.paths import HeadSteps, LayerPaths, get_blocks, layer_paths
from layerwise.hub import legacy_config


def build_model(
    auto_class: Any,
    model_name_or_path: Optional[str],
    model_type: Optional[str],
    pretrained: bool,
    config_overrides: Optional[dict[str, Any]],
    option: str,
    **config_kwargs: Any,
) -> Any:  # a transformers model: its config and methods are dynamic
    """Build an ``auto_class`` model from a hub name / local path, or from ``model_type`` alone (offline, random).

    ``pretrained=False`` with a name builds the named architecture with random weights (its config is still read);
    ``model_type`` without a name builds ``AutoConfig.for_model(model_type, **config_overrides)``.
    """
    from transformers import AutoConfig

    overrides = {**(config_overrides or {}), **config_kwargs}
    if model_name_or_path is not None:
        legacy = legacy_config(str(model_name_or_path))
        if legacy is not None:
            return _build_transformer_lens(auto_class, str(model_name_or_path), legacy, pretrained, overrides, option)
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


def _build_transformer_lens(
    auto_class: Any, spec: str, config: dict[str, Any], pretrained: bool, overrides: dict[str, Any], option: str
) -> nn.Module:
    """A legacy TransformerLens checkpoint as GPT-2 (:mod:`layerwise.features.transformer_lens`)."""
    dtype = overrides.pop("dtype", None)
    if overrides:
        raise ValueError(
            f"`{option}={spec!r}` is a TransformerLens checkpoint, read as GPT-2 whole on one device: "
            f"{sorted(overrides)} cannot be applied to it (drop them; use --dtype only)."
        )
    if auto_class.__name__ not in ("AutoModelForCausalLM", "AutoModel"):
        raise ValueError(f"`{option}={spec!r}` is a TransformerLens language model: it has no {auto_class.__name__}.")
    model = transformer_lens.load_gpt2(spec, config, option, pretrained, dtype)
    return model.transformer if auto_class.__name__ == "AutoModel" else model


def input_device(model: nn.Module) -> torch.device:
    """Where a model's inputs go: the device of its input embedding (of its first placed weight otherwise).

    With a ``device_map`` the model is spread over devices and some weights may be offloaded (on the meta device,
    loaded by accelerate's hooks, which also move the inputs): the CPU is then a safe place for the inputs.
    """
    get_embeddings = getattr(model, "get_input_embeddings", None)
    embeddings = get_embeddings() if callable(get_embeddings) else None
    candidates = list(embeddings.parameters()) if isinstance(embeddings, nn.Module) else []
    for parameter in [*candidates, *model.parameters()]:
        if not parameter.is_meta:
            return parameter.device
    return torch.device("cpu")


def _enable_activation_checkpointing(model: nn.Module) -> None:
    """Turn on the model's own activation checkpointing, non-reentrant (under its older name in older transformers)."""
    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)  # `gradient_checkpointing_enable` before
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        cast(Any, model).gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class HFBackbone(nn.Module):
    """Shared plumbing of the Hugging Face taps: the model, its blocks, its head, block outputs via hooks.

    Hooks are attached for the duration of one forward pass only (they never outlive it, also on error), so the
    module deep-copies, pickles and exports like the plain model.
    """

    model: Any  # a transformers model: its config and methods are dynamic

    def __init__(self, model: nn.Module, option: str, activation_checkpointing: bool = False) -> None:
        super().__init__()
        if activation_checkpointing:  # transformers' own: every block recomputed in the backward pass
            _enable_activation_checkpointing(model)
        # from_pretrained returns the model in eval mode, and Lightning (>= 2.2) keeps the modes it finds at the start
        # of fit: without this, a pretrained backbone would be fine-tuned with dropout off. Validation still runs in
        # eval mode (Lightning switches the whole module and restores these modes afterwards).
        self.model = model.train()
        self.paths: LayerPaths = layer_paths(model, option)
        blocks = get_blocks(model, self.paths, option)
        self._option = option
        self.num_layers = len(blocks)
        self.embed_dim = int(self.model.config.hidden_size)

    @property
    def blocks(self) -> Union[nn.ModuleList, nn.Sequential]:
        """The model's block list."""
        return get_blocks(self.model, self.paths, self._option)

    @property
    def head_steps(self) -> HeadSteps:
        """The shared head over the model's own modules."""
        return HeadSteps(self.model, self.paths.shared_head, self._option)

    def run_collecting(self, run: Any) -> list[Tensor]:
        """Call ``run()`` (one forward pass of the model) and return every block's output, in block order."""
        return collect_block_outputs(self.blocks, run)

    def head(self, h: Tensor) -> Tensor:
        """The model's own shared head, applied to features ``(..., d)``."""
        return self.head_steps(h)

    def head_modules(self) -> nn.Module:
        """A fresh, trainable copy of the shared head."""
        return self.head_steps.copy()


def no_cache(model: nn.Module) -> dict[str, bool]:
    """``{"use_cache": False}`` when the model's forward takes it (a Hugging Face model), else ``{}``."""
    import inspect

    return {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}
