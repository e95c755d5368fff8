"""The option groups that several commands share: where a model comes from, and where a text comes from.

Each group is one typed dataclass holding its validation in one place. The commands keep their flat flags
(``--checkpoint``, ``--model``, ``--text``, ...: a dataclass parameter would become ``--source.model`` in
jsonargparse) and build the group from them, e.g. ``ModelSource(checkpoint, model, tokenizer, tokenizer_dir)``.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

from layerwise.errors import UsageError

# accelerate's placement of a Hugging Face model: "auto", or module name -> "cpu", a GPU index or "disk"
DeviceMap = Optional[Union[str, dict[str, Union[str, int]]]]
DType = Literal["auto", "float32", "bfloat16", "float16", "float64"]


def at_least(flag: str, value: int, least: int, why: str = "") -> None:
    """Refuse, naming ``--flag``, a number below its least value (``why``: what the least value is for)."""
    if value < least:
        raise ValueError(f"`--{flag}={value}` must be >= {least}{f' ({why})' if why else ''}.")


def load_causal_lm(*args: Any, **kwargs: Any) -> Any:
    """:func:`layerwise.commands.models.load_causal_lm`, imported when called (it imports torch)."""
    from layerwise.commands.models import load_causal_lm as load

    return load(*args, **kwargs)


def load_tokenizer_spec(*args: Any, **kwargs: Any) -> Any:
    """:func:`layerwise.commands.models.load_tokenizer_spec`, imported when called."""
    from layerwise.commands.models import load_tokenizer_spec as load

    return load(*args, **kwargs)


def model_tokenizer(model: Optional[str]) -> Optional[str]:
    """The tokenizer a model's own name implies: the one a TransformerLens checkpoint's config names, else the name."""
    from layerwise.hub import legacy_config

    legacy = legacy_config(model) if model else None
    return str(legacy["tokenizer_name"]) if legacy and legacy.get("tokenizer_name") else model


def check_model_path(spec: Optional[str], flag: str) -> None:
    """Refuse, naming ``flag``, a model written as a local path that is not there.

    A local path starts with ``/``, ``.`` or ``~``, ends with ``.ckpt``, holds more than one ``/``, or is
    ``folder/name`` where ``folder`` is a local folder (offline, the loader would otherwise retry the hub for it for
    ~20 s); any other ``name`` or ``owner/name`` is a hub id, left to the loader.
    """
    if spec is None:
        return
    text = str(spec)
    pathlike = text.startswith(("/", ".", "~")) or text.endswith(".ckpt") or text.count("/") > 1 or "\\" in text
    pathlike = pathlike or (text.count("/") == 1 and Path(text.split("/")[0]).is_dir())
    if pathlike and not Path(text).expanduser().exists():
        raise UsageError(f"`{flag}={text}` does not exist (give a model folder, a layerwise .ckpt or a hub id).")


def check_hub_model(spec: str, flag: str) -> None:
    """Refuse at once, naming ``flag``, a hub id that is not in the Hugging Face cache while the Hub cannot be reached.

    Offline, the loader would otherwise retry the Hub for ~30 s before saying the same.
    """
    from huggingface_hub import try_to_load_from_cache

    from layerwise import hub

    if Path(spec).expanduser().exists():
        return
    try:
        if isinstance(try_to_load_from_cache(spec, "config.json"), str):
            return
    except ValueError:  # not a valid hub id at all: the loader says so in its own words
        return
    where = "offline mode is on (HF_HUB_OFFLINE)"
    if not hub.hub_offline():
        reason = hub.hub_unreachable_reason(hub.hub_endpoint())
        if reason is None:
            return  # the Hub answers: the loader downloads it, or says why not
        where = f"the Hub at {hub.hub_endpoint()} cannot be reached ({reason})"
    raise UsageError(
        f"`{flag}={spec}` is neither a local folder nor in the Hugging Face cache, and {where}: give a local model "
        "folder or a layerwise .ckpt."
    )


def load_model_as(spec: str, flag: str, *args: Any, **kwargs: Any) -> Any:
    """``load_model(spec, flag, ...)``, its errors naming ``flag`` itself (not the training CLI's sub-options)."""
    from layerwise.engines.checkpoint import load_model

    check_model_path(spec, flag)
    if isinstance(spec, (str, Path)) and not str(spec).endswith(".ckpt"):
        check_hub_model(str(spec), flag)
    try:
        return load_model(spec, flag, *args, **kwargs)
    except ValueError as error:
        if f"{flag}.model_name_or_path" not in str(error):
            raise
        reason = str(error).split(" could not be loaded (", 1)[-1].split(". Offline,", 1)[0].splitlines()[0]
        raise UsageError(
            f"`{flag}={spec}` could not be loaded ({reason.rstrip(').')}): give a local model folder, a layerwise "
            ".ckpt, or a hub id (offline: only one in the Hugging Face cache)."
        ) from None


def check_layer_numbers(flag: str, layers: list[int], total: Optional[int] = None) -> None:
    """Every layer number of ``flag`` in 1..total (1..L while the model is not loaded yet)."""
    for layer in layers:
        if layer < 1 or (total is not None and layer > total):
            bound = f"1..{total}" if total is not None else "1..L"
            raise ValueError(f"`{flag}` holds {layer}: layers are numbered {bound}.")


@dataclass(frozen=True)
class ModelSource:
    """A causal LM and its tokenizer, the options ``generate``, ``lens`` and ``coupling`` share.

    ``--checkpoint`` or ``--model``, ``--tokenizer``, ``--tokenizer_dir``, ``--dtype``, ``--device_map``,
    ``--offload_folder``.
    """

    checkpoint: Optional[Path] = None
    model: Optional[str] = None
    tokenizer: Optional[str] = None
    tokenizer_dir: Optional[Path] = None
    dtype: Optional[str] = None
    device_map: DeviceMap = None
    offload_folder: Optional[Path] = None

    def load(self) -> tuple[Any, Any, int]:
        """The model, its tokenizer and its number of blocks; a bad combination of options fails before loading."""
        from layerwise.features.paths import num_blocks

        checkpoint, model, tokenizer = self.checkpoint, self.model, self.tokenizer
        if (checkpoint is None) == (model is None):
            raise ValueError(
                "Give exactly one of --checkpoint (a layerwise checkpoint) and --model (a Hugging Face LM)."
            )
        if checkpoint is not None and tokenizer is None:
            raise ValueError(
                "--tokenizer is required with --checkpoint (e.g. --tokenizer byte, as the model was trained)."
            )
        check_model_path(model, "--model")
        check_model_path(None if checkpoint is None else str(checkpoint), "--checkpoint")
        try:
            tokenizer_object = load_tokenizer_spec(tokenizer or model_tokenizer(model), self.tokenizer_dir)
        except ValueError as error:
            if tokenizer is not None:
                raise
            raise UsageError(
                f"`--model={model}`: its tokenizer could not be loaded (give --tokenizer, e.g. byte): {error}"
            ) from None
        if model is not None:
            lm = load_model_as(model, "--model", "causal_lm", self.dtype, self.device_map, self.offload_folder)
        else:
            lm = load_causal_lm(checkpoint, model, self.dtype, self.device_map, self.offload_folder)
        return lm, tokenizer_object, num_blocks(lm, "--checkpoint" if checkpoint is not None else "--model")

    def load_on(self, device: Optional[str]) -> tuple[Any, Any, int]:
        """:meth:`load`, then the model on ``device`` (default: cuda when available) unless ``device_map`` placed it."""
        import torch

        lm, tokenizer_object, total = self.load()
        if self.device_map is None:
            lm = lm.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        return lm, tokenizer_object, total


def model_positions(model: Any) -> Optional[int]:
    """The positions a model reads (its config's ``max_position_embeddings``, ``n_positions`` or ``n_ctx``), or None."""
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_block_size(block_size: int, models: dict[str, Any], flag: str = "--block_size") -> None:
    """Refuse ``block_size`` longer than the positions of any of ``models`` (flag -> loaded model), before a forward."""
    for model_flag, model in models.items():
        positions = model_positions(model)
        if positions is not None and block_size > positions:
            raise UsageError(f"`{flag}={block_size}` exceeds the {positions} positions `{model_flag}` reads.")


def vocab_size(model: Any) -> Optional[int]:
    """The number of token ids a model reads: the rows of its input embedding (else its config's ``vocab_size``)."""
    get = getattr(model, "get_input_embeddings", None)
    embedding = get() if callable(get) else None
    weight = getattr(embedding, "weight", None)
    if weight is not None and weight.dim() == 2:
        return int(weight.shape[0])
    value = getattr(getattr(model, "config", None), "vocab_size", None)
    return value if isinstance(value, int) else None


def check_same_vocab(model_a: Any, model_b: Any) -> None:
    """Refuse two models that read different token ids (one tokenizer feeds both), before any forward."""
    size_a, size_b = vocab_size(model_a), vocab_size(model_b)
    if size_a is not None and size_b is not None and size_a != size_b:
        raise UsageError(
            f"`--model_b` reads {size_b} token ids, `--model_a` {size_a}: the two models must read the same ids."
        )


def check_token_ids(largest: int, tokenizer: str, models: dict[str, Any]) -> None:
    """Refuse text whose token ids (the largest is ``largest``) reach past a model's embedding, before a forward.

    A tokenizer with more ids than the models (``byte`` has 257) would otherwise end in an ``IndexError`` inside the
    embedding lookup. The ids actually read are checked, not the tokenizer's size: a tokenizer may hold ids the
    text never uses (an added padding token).
    """
    for model_flag, model in models.items():
        size = vocab_size(model)
        if size is not None and largest >= size:
            raise UsageError(
                f"`--tokenizer={tokenizer}` gives the text token id {largest}, but `{model_flag}` reads ids below "
                f"{size}: give the tokenizer the models were trained with."
            )


# the TextDataModule options' names in its messages -> the flags of `compare` and `stitch`
_TEXT_FLAGS = {
    "--data.init_args.train_files": "--text",
    "--data.init_args.val_files": "--text",
    "--data.init_args.dataset_config": "--dataset_config",
    "--data.init_args.dataset": "--dataset",
    "--data.init_args.block_size": "--block_size",
    "--data.init_args.batch_size": "--batch_size",
    "--data.init_args.tokenizer_dir": "--tokenizer_dir",
    "--data.init_args.tokenizer": "--tokenizer",
}


def text_flags(message: str) -> str:
    """A TextDataModule message with this command's own flags (``--text``, ``--block_size``, ...)."""
    import re

    message = re.sub(
        r"cannot be split by --data\.init_args\.val_fraction=\S+", "are too few to hold out its last 10 %", message
    )
    message = re.sub(r"--data\.init_args\.max_(train|val)_blocks", "--max_blocks", message)
    for old, new in _TEXT_FLAGS.items():
        message = message.replace(old, new)
    return message


@dataclass(frozen=True)
class TextSource:
    """A text to read in packed blocks, the options ``compare`` and ``stitch`` share.

    ``--text`` (local files), or ``--dataset`` (a hub dataset id) with ``--dataset_config``.
    """

    text: Optional[list[Path]] = None
    dataset: Optional[str] = None
    dataset_config: Optional[str] = None

    def check(self) -> None:
        """Exactly one of --text and --dataset, and every --text a file."""
        if (self.text is None) == (self.dataset is None):
            raise ValueError("Give exactly one of --text (local files) and --dataset (a hub dataset id).")
        for path in self.text or []:
            if not Path(path).is_file():
                raise ValueError(f"`--text={path}` is not a file.")

    def datamodule(
        self,
        tokenizer: str,
        tokenizer_dir: Optional[Path],
        block_size: int,
        batch_size: int,
        max_train_blocks: Optional[int],
        max_val_blocks: Optional[int],
        stage: str,
        models: Optional[dict[str, Any]] = None,
    ) -> Any:
        """The packed text blocks ``compare`` and ``stitch`` read (``TextDataModule``: held-out tail of --text).

        ``models`` (flag -> loaded model): every token id of the blocks must be one they read (:func:`check_token_ids`).
        """
        from layerwise.datamodules import TextDataModule

        self.check()
        try:
            data = TextDataModule(
                dataset=self.dataset,
                dataset_config=self.dataset_config,
                train_files=[str(path) for path in self.text] if self.text else None,
                tokenizer=tokenizer,
                tokenizer_dir=str(tokenizer_dir) if tokenizer_dir else None,
                block_size=block_size,
                batch_size=batch_size,
                max_train_blocks=max_train_blocks,
                max_val_blocks=max_val_blocks,
            )
            data.prepare_data()
            data.setup(stage)
        except (ValueError, FileNotFoundError) as error:
            message = text_flags(str(error))
            if message == str(error) and not isinstance(error, ValueError):
                raise
            source = "--text" if self.text else "--dataset"
            raise UsageError(message if source in message else f"`{source}`: {message}") from None
        blocks = [part for part in (data.train_blocks, data.val_blocks) if part is not None and part.numel()]
        if models and blocks:
            check_token_ids(max(int(part.max()) for part in blocks), tokenizer, models)
        return data
