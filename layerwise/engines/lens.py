"""The tuned lens's translators (Belrose et al. 2023): one affine map per layer, and the one file that holds them.

A tuned lens reads layer ``l`` as ``head(h + A_l h + b_l)``: the model's own head (final norm + classifier) after an
affine translator trained so that the distribution it gives matches the last layer's
(:class:`~layerwise.lightning_modules.TunedLens` trains it). The last layer needs none (its translator would be the
identity), as in tuned-lens's ``TunedLens``, so a model of ``L`` blocks has ``L - 1`` translators, for layers
``1..L-1`` (the residual after each block, before any final norm; tuned-lens's translator ``l`` reads
``hidden_states[l]``, the same residual, and its translator 0 reads the embeddings, which layerwise does not read).

The file is safetensors (no pickle: tensors and a flat string metadata only): ``translators.{i}.weight`` ``(d, d)``
and ``translators.{i}.bias`` ``(d,)`` for layer ``i + 1``, and the metadata ``format`` = ``layerwise.tuned_lens``,
``num_layers`` (L), ``d_model``.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional, Union

from torch import Tensor, nn

from layerwise.engines.readout import DEFAULT_CHUNK_SIZE, Head, TranslatedHead, chunked_readout
from layerwise.errors import UsageError
from layerwise.metrics.functional import Readout
from layerwise.results import write_atomic

LENS_FORMAT = "layerwise.tuned_lens"
TUNED_LENS_FILE = "tuned_lens.safetensors"


class Translators(nn.Module):
    """The ``L - 1`` affine translators of a tuned lens, each ``nn.Linear(d, d)`` starting at zero (the identity map).

    Args:
        num_layers: L, the model's blocks (the last layer gets no translator).
        d_model: the residual width d.
    """

    def __init__(self, num_layers: int, d_model: int) -> None:
        super().__init__()
        if num_layers < 1 or d_model < 1:
            raise ValueError(f"Translators need num_layers >= 1 and d_model >= 1, got {num_layers} and {d_model}.")
        self.num_layers, self.d_model = int(num_layers), int(d_model)
        linears = [nn.Linear(d_model, d_model) for _ in range(num_layers - 1)]
        for translator in linears:
            nn.init.zeros_(translator.weight)
            nn.init.zeros_(translator.bias)
        self.translators = nn.ModuleList(linears)

    def heads(self, head: Head) -> list[Head]:
        """One head per layer: ``head`` through each layer's translator, the plain ``head`` at the last layer."""
        return [*(TranslatedHead(head, translator) for translator in self.linears()), head]

    def linears(self) -> list[nn.Linear]:
        """The translators of layers 1..L-1, in order."""
        return [translator for translator in self.translators if isinstance(translator, nn.Linear)]


def save_translators(path: Union[str, Path], translators: Translators) -> Path:
    """Write the translators to ``path`` (safetensors, atomically); returns the path."""
    from safetensors.torch import save

    tensors = {name: value.detach().cpu().contiguous() for name, value in translators.state_dict().items()}
    metadata = {"format": LENS_FORMAT, "num_layers": str(translators.num_layers), "d_model": str(translators.d_model)}
    payload = save(tensors, metadata=metadata)
    return write_atomic(path, lambda file: file.write(payload))


def load_translators(path: Union[str, Path], option: str = "lens") -> Translators:
    """The :class:`Translators` written by :func:`save_translators` (no pickle); a bad file is one ``UsageError``."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"`{option}={path}`: no such file; give `logit` or a tuned lens file ({TUNED_LENS_FILE}).")
    data = path.read_bytes()
    try:
        tensors: dict[str, Tensor] = load(data)
        metadata = _metadata(data)
    except (SafetensorError, ValueError) as error:
        raise UsageError(f"`{option}={path}` is not a safetensors file ({error}).") from None
    if metadata.get("format") != LENS_FORMAT:
        raise UsageError(f"`{option}={path}` is not a layerwise tuned lens (its metadata format is not {LENS_FORMAT}).")
    translators = Translators(int(metadata["num_layers"]), int(metadata["d_model"]))
    try:
        translators.load_state_dict(tensors)
    except RuntimeError as error:
        raise UsageError(f"`{option}={path}` does not hold its translators: {str(error).splitlines()[0]}") from None
    return translators


def _metadata(data: bytes) -> dict[str, str]:
    """The string metadata of a safetensors payload (its JSON header's ``__metadata__``)."""
    import json

    length = int.from_bytes(data[:8], "little")
    return dict(json.loads(data[8 : 8 + length]).get("__metadata__") or {})


def check_lens_fits(translators: Translators, num_layers: int, d_model: int, option: str = "lens") -> None:
    """One ``UsageError`` naming ``option`` when a tuned lens was trained for another depth or width."""
    if (translators.num_layers, translators.d_model) != (num_layers, d_model):
        raise UsageError(
            f"`{option}`: the tuned lens was trained for {translators.num_layers} layers of width "
            f"{translators.d_model}, but this model has {num_layers} of width {d_model}."
        )


def lens_heads(head: Head, lens: Union[str, Path, Translators], num_layers: int, d_model: int) -> list[Head]:
    """The per-layer heads of a lens: ``"logit"`` -> ``head`` at every layer; a tuned lens file or translators."""
    if isinstance(lens, str) and lens == "logit":
        return [head] * num_layers
    translators = lens if isinstance(lens, Translators) else load_translators(lens)
    check_lens_fits(translators, num_layers, d_model)
    return translators.heads(head)


class LensReader:
    """Every selected layer of a module read through a lens, beside the final layer (the logit-lens analysis's reader).

    Args:
        lens: ``"logit"`` (the module's own reading: its ``reading_heads()``, else the shared head) or a tuned lens
            file, read here (a bad file is one ``UsageError`` naming ``option``).
        option: the option's name in errors.
    """

    def __init__(self, lens: str = "logit", option: str = "lens") -> None:
        self.lens, self.option = lens, option
        self.translators = None if lens == "logit" else load_translators(lens, option)
        self.heads: Union[Head, list[Head], None] = None
        self.regroup: Optional[Head] = None
        self.chunk_size = DEFAULT_CHUNK_SIZE

    def attach(self, module: Any, tap: Any, layer_numbers: Sequence[int], depth: int, width: int) -> None:
        """Take the lens's heads for the 1-based ``layer_numbers`` of a model of ``depth`` blocks of ``width``.

        From ``module`` (a layerwise module), or from the hooks' ``tap`` on a user's own model when it is not None.
        """
        if tap is not None:
            head, own = tap.head, None
        else:
            backbone = module.backbone
            head = backbone.head
            own = module.reading_heads() if hasattr(module, "reading_heads") else None
            self.regroup = None if backbone.token_level else getattr(module, "data_logits", None)
            self.chunk_size = int(getattr(module, "chunk_size", DEFAULT_CHUNK_SIZE))
        heads: Union[Head, list[Head]] = head if own is None else own
        if self.translators is not None:
            device = next(iter(module.parameters())).device
            self.translators.to(device)
            check_lens_fits(self.translators, depth, width, self.option)
            heads = self.translators.heads(head)
        self.heads = [heads[number - 1] for number in layer_numbers] if isinstance(heads, list) else heads

    def read(self, features: Tensor, targets: Optional[Tensor]) -> Readout:
        """The :class:`Readout` of the selected layers' ``features`` ``(L, N, d)``, lens statistics included.

        The reference of ``kl_to_final`` and ``final_rank`` is the deepest selected layer.
        """
        assert self.heads is not None, "LensReader.attach first"
        if self.translators is not None:
            self.translators.to(features.device)
        return chunked_readout(self.heads, features, targets, self.chunk_size, self.regroup, reference=True)


__all__ = [
    "LENS_FORMAT",
    "LensReader",
    "TUNED_LENS_FILE",
    "Translators",
    "check_lens_fits",
    "lens_heads",
    "load_translators",
    "save_translators",
]
