"""Fully sharded data parallel (FSDP2, ``torch.distributed.fsdp.fully_shard``) over a backbone's own parts.

Layer access for sharded training and analysis: every block is one FSDP unit (its weights gathered only while it
runs) and the backbone is the root unit, holding the embeddings and the shared head (final norm + classifier).
FSDP2 keeps the root's weights gathered from its forward until the backward, so the shared head reads every layer
(L calls per step in the aligned loss, the logit lens of every validation batch) with its weights gathered once,
and its gradient is reduced once, after all L calls. (A head sharded as its own unit would reduce its gradient
after the first of its L backward calls.) A head tied to the input embedding (GPT-2) is in the root unit with it
by construction. Lightning's ``ModelParallelStrategy`` calls ``LayerwiseModule.configure_model``, which calls
:func:`shard_backbone` with the data-parallel mesh.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

from torch import nn

from layerwise.features.paths import get_blocks


def shard_backbone(backbone: nn.Module, mesh: Any, mp_policy: Optional[Any] = None) -> None:
    """Apply ``fully_shard`` to every block, then to the backbone (the root unit, with the head), in place.

    Args:
        backbone: a layerwise backbone with ``model`` and ``paths`` (``TimmViT``, ``HFEncoder``, ``HFCausalLM``).
        mesh: the 1-D data-parallel device mesh (``LightningModule.device_mesh["data_parallel"]``).
        mp_policy: an FSDP2 ``MixedPrecisionPolicy`` (e.g. bf16 parameters, float32 reduction), or None.
    """
    from torch.distributed.fsdp import fully_shard

    options = {"mesh": mesh} if mp_policy is None else {"mesh": mesh, "mp_policy": mp_policy}
    for block in get_blocks(backbone.model, backbone.paths):
        fully_shard(block, **options)
    fully_shard(backbone, **options)


@contextmanager
def gathered_root(module: Any) -> Iterator[None]:
    """The FSDP2 root unit's own parameters (embeddings, final norm, head) gathered for the duration, if sharded.

    Its forward gathers them itself; a walk that calls the backbone's parts instead (early exit: ``embed``, each
    block, ``head``) needs them gathered around it (``FSDPModule.unshard``/``reshard``, FSDP2's public API). Each
    block, its own unit, still gathers its weights in its forward.
    """
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        FSDPModule = ()  # noqa: N806
    if not isinstance(module, FSDPModule):
        yield
        return
    module.unshard()
    try:
        yield
    finally:
        module.reshard()
