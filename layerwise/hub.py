"""The Hugging Face Hub as layerwise meets it: is it reachable, and what does a hub id or folder hold.

A leaf every part may import (it imports nothing of layerwise but ``errors``, and ``huggingface_hub`` or ``datasets``
only inside the function that needs them). ``datasets.load_dataset`` and ``from_pretrained`` retry an unreachable Hub
with exponential back-off (about 25 s per file, longer on a network that drops packets), so before calling them the
datamodules and the commands probe the endpoint once with a short, hard timeout. In offline mode (``HF_HUB_OFFLINE=1``
or ``HF_DATASETS_OFFLINE=1``) the probe is skipped. ``legacy_config`` tells a legacy TransformerLens checkpoint by its
config, which layer access (to build the model) and the tokenizers (its tokenizer's name) both read.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Optional

from layerwise.errors import UsageError

HUB_OWNERS = ("NeelNanda/", "ArthurConmy/", "Baidicoot/")  # TransformerLens's own list of legacy-format owners


class HubUnreachable(UsageError, ConnectionError):
    """The Hub cannot give a dataset (unreachable, or offline without a cached copy): one line naming the option.

    A ``ConnectionError`` as before, and a ``UsageError``, so that ``layerwise fit`` prints it in one line.
    """


PROBE_TIMEOUT_S = 5.0


def hub_endpoint() -> str:
    """The Hub URL ``datasets`` downloads from (honours ``HF_ENDPOINT``)."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_offline() -> bool:
    """Whether ``datasets`` runs in offline mode (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``)."""
    import datasets

    return bool(datasets.config.HF_HUB_OFFLINE)


def hub_unreachable_reason(url: str, timeout_s: Optional[float] = None) -> Optional[str]:
    """None if an HTTP HEAD to ``url`` gets any response within ``timeout_s`` seconds, else why it did not.

    ``timeout_s`` defaults to ``PROBE_TIMEOUT_S``.

    The request runs in a daemon thread joined with a deadline, because a stalled DNS lookup is not bounded by the
    socket timeout. It goes through ``huggingface_hub``'s own HTTP session, so proxies and certificates are those
    the download would use. Any HTTP status, even an error code, counts as reachable.
    """
    from huggingface_hub import get_session

    timeout_s = PROBE_TIMEOUT_S if timeout_s is None else timeout_s
    outcome: list[Optional[str]] = []

    def probe() -> None:
        try:
            get_session().head(url, timeout=timeout_s)
            outcome.append(None)
        except Exception as err:  # any transport failure (DNS, refused, TLS, timeout) means "not reachable"
            outcome.append(f"{type(err).__name__}: {err}")

    thread = threading.Thread(target=probe, name="layerwise-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout_s + 1.0)
    return outcome[0] if outcome else f"no answer within {timeout_s:.0f} s"


def check_reachable(what: str, instead: str) -> None:
    """Raise :class:`HubUnreachable` at once when the Hub cannot be reached to load ``what`` (never offline).

    ``instead`` says what to pass instead (a local copy); the message adds HF_HUB_OFFLINE for a cached copy.
    """
    if hub_offline():
        return
    endpoint = hub_endpoint()
    reason = hub_unreachable_reason(endpoint)
    if reason is not None:
        raise HubUnreachable(
            f"Cannot reach the Hugging Face Hub at {endpoint} ({reason}) to load {what}. {instead}, or set "
            "HF_HUB_OFFLINE=1 to use a copy already in the Hugging Face cache."
        )


def legacy_config(spec: str) -> Optional[dict[str, Any]]:
    """The TransformerLens config of a folder or hub repo in the legacy format, ``None`` for anything else.

    A folder is recognised by its ``config.json``. On the hub only the owners that publish this format are asked
    (:data:`HUB_OWNERS`, as TransformerLens itself does), so other hub ids cost no request; any failure to reach the
    hub returns ``None`` so that transformers reports its own error.
    """
    path = Path(spec)
    if path.is_dir():
        file = path / "config.json"
        if not file.is_file():
            return None
    elif path.exists() or not str(spec).startswith(HUB_OWNERS):
        return None
    else:
        try:
            from huggingface_hub import hf_hub_download

            file = Path(hf_hub_download(str(spec), "config.json"))
        except Exception:  # offline, gated or missing: transformers will say why
            return None
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or "model_type" in config or not {"d_model", "n_layers", "act_fn"} <= set(config):
        return None
    return config
