"""The one way layerwise cuts a model at depth ``d``: its first ``d`` blocks, then its own final norm and head.

:func:`truncated` cuts a model in place for the duration of a ``with`` block (generation, the lens, early exit);
:func:`truncated_copy` builds a fresh model of depth ``d`` holding copies of the first blocks and the head (export).
"""

import copy
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

from torch import Tensor, nn

from layerwise.features.paths import TIMM_VIT, LayerPaths, get_blocks, layer_paths

_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "n_layers")


def check_depth(depth: Any, num_layers: int, option: str = "--depth") -> None:
    """A ValueError naming ``option`` unless ``depth`` is an int in ``1..num_layers``."""
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= num_layers:
        raise ValueError(
            f"`{option}={depth!r}` must be a layer number in 1..{num_layers} (the model has {num_layers} blocks)."
        )


@contextmanager
def truncated(
    model: nn.Module, depth: int, paths: Optional[LayerPaths] = None, option: str = "--layer"
) -> Iterator[nn.Module]:
    """Make ``model`` run only its first ``depth`` blocks, then its own final norm and head.

    Inside the context the model's own forward (and ``generate``) computes ``head(h_d)``, ``h_d`` the residual
    stream after block ``d`` of the full model. The block list is replaced by its first ``d`` entries (the same
    module objects, so hooks on blocks keep working) and the config fields that cache and mask code read
    (``num_hidden_layers``, ``layer_types``) are shortened to match. Everything is restored on exit, also when the
    body raises.

    Args:
        model: a model of a family in :data:`~layerwise.features.paths.FAMILIES` (or give ``paths``).
        depth: ``d`` in ``1..L``.
        paths: the model's paths (default: from the table).
        option: the flag or argument named in errors.
    """
    paths = paths or layer_paths(model, option)
    check_depth(depth, len(get_blocks(model, paths)), option)
    with kept_blocks(model, 0, depth, paths, option):
        yield model


@contextmanager
def kept_blocks(
    model: nn.Module, start: int, stop: int, paths: Optional[LayerPaths] = None, option: str = "--layer"
) -> Iterator[nn.Module]:
    """Make ``model`` run only its blocks ``start + 1 .. stop`` (0-based ``start:stop``), in place, restored on exit.

    :func:`truncated` is ``kept_blocks(model, 0, d)``; stitching keeps the blocks after m
    (``kept_blocks(model, m, L)``), whose first block then reads the embeddings unless its input is replaced. The
    config's depth fields (``num_hidden_layers``, ``layer_types``) are cut the same way; run such a model without a
    KV cache (``use_cache=False``): its blocks keep their own ``layer_idx``.
    """
    paths = paths or layer_paths(model, option)
    blocks = get_blocks(model, paths)
    if not 0 <= start < stop <= len(blocks):
        raise ValueError(f"`{option}`: blocks {start + 1}..{stop} are not among the model's 1..{len(blocks)}.")
    parent_path, _, name = paths.blocks.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    config = getattr(model, "config", None)
    saved = _config_depth(config)
    kept = list(blocks)[start:stop]
    setattr(parent, name, nn.Sequential(*kept) if isinstance(blocks, nn.Sequential) else nn.ModuleList(kept))
    try:
        _set_config_depth(config, start, stop, len(blocks))
        yield model
    finally:
        setattr(parent, name, blocks)
        _restore_config_depth(config, saved)


def _config_depth(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    return {key: getattr(config, key) for key in (*_LAYER_COUNT_KEYS, "layer_types") if hasattr(config, key)}


def _set_config_depth(config: Any, start: int, stop: int, total: int) -> None:
    if config is None:
        return
    for key in _LAYER_COUNT_KEYS:
        if getattr(config, key, None) == total:
            setattr(config, key, stop - start)
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, list) and len(layer_types) == total:
        config.layer_types = layer_types[start:stop]


def _restore_config_depth(config: Any, saved: dict[str, Any]) -> None:
    for key, value in saved.items():
        setattr(config, key, value)


def truncated_config(config: Any, depth: int) -> Any:
    """A copy of a Hugging Face config with ``depth`` layers (and ``layer_types`` cut to its first ``depth``)."""
    config = copy.deepcopy(config)
    stored = config.to_dict()
    keys = [key for key in _LAYER_COUNT_KEYS if key in stored]
    if not keys:
        raise TypeError(f"{type(config).__name__} has none of {_LAYER_COUNT_KEYS}: cannot set its number of layers.")
    if isinstance(stored.get("layer_types"), list):
        config.layer_types = list(stored["layer_types"][:depth])
    setattr(config, keys[0], depth)
    return config


def timm_create_kwargs(model: Any, depth: int) -> dict[str, Any]:  # a timm VisionTransformer
    """The ``timm.create_model`` arguments of a timm VisionTransformer with ``depth`` blocks."""
    architecture = (getattr(model, "pretrained_cfg", None) or {}).get("architecture")
    if not architecture:
        raise TypeError(f"{type(model).__name__} has no timm `pretrained_cfg['architecture']`: cannot re-create it.")
    patch = model.patch_embed
    return {
        "model_name": architecture,
        "num_classes": model.num_classes,
        "global_pool": model.global_pool,
        "img_size": tuple(patch.img_size),
        "patch_size": tuple(patch.patch_size),
        "in_chans": patch.proj.in_channels,
        "embed_dim": model.embed_dim,
        "num_heads": model.blocks[0].attn.num_heads,
        "drop_rate": float(model.head_drop.p),
        "depth": depth,
    }


def first_blocks_state(state: dict[str, Tensor], blocks: str, depth: int) -> dict[str, Tensor]:
    """``state`` without the entries of blocks ``depth, depth+1, …`` of the block list at dotted path ``blocks``."""
    pattern = re.compile(rf"{re.escape(blocks)}\.(\d+)\.")

    def beyond(key: str) -> bool:
        match = pattern.match(key)
        return match is not None and int(match.group(1)) >= depth

    return {key: value for key, value in state.items() if not beyond(key)}


def truncated_copy(model: nn.Module, depth: int, option: str = "--depth") -> nn.Module:
    """A fresh model of ``model``'s class with ``depth`` blocks, holding copies of its first blocks and its head.

    timm ViTs are re-created with ``timm.create_model(depth=d)``; Hugging Face models with their own class on a
    config of ``d`` layers. The result is in eval mode, in the dtype of ``model``, and needs nothing of layerwise.
    """
    paths = layer_paths(model, option)
    check_depth(depth, len(get_blocks(model, paths)), option)
    if paths.family == TIMM_VIT:
        import timm

        kwargs = timm_create_kwargs(model, depth)
        fresh = timm.create_model(kwargs.pop("model_name"), pretrained=False, **kwargs)
    else:
        fresh = type(model)(truncated_config(model.config, depth))
    fresh.to(dtype=next(model.parameters()).dtype)
    fresh.load_state_dict(first_blocks_state(model.state_dict(), paths.blocks, depth), strict=True)
    return fresh.eval()
