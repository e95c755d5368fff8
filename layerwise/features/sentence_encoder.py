"""A sentence encoder for the coherence of generated text (SimCTG): a Hugging Face encoder through the hub wrapper."""

from typing import Literal, Optional

import torch
from torch import Tensor

from layerwise.features.hf import build_model


class SentenceEncoder:
    """A SimCSE-style sentence encoder: ``list[str] -> (N, d)`` embeddings from a Hugging Face encoder.

    SimCTG's coherence uses ``princeton-nlp/sup-simcse-bert-base-uncased``. SimCSE's own tool embeds a sentence with
    the ``pooler_output`` (the [CLS] hidden state through BERT's dense + tanh pooler) for supervised models
    (``pooling="cls"``) and with the raw [CLS] hidden state for unsupervised ones (``pooling="cls_before_pooler"``,
    models named ``unsup-simcse-*``).

    Args:
        name_or_path: hub name or local folder holding an ``AutoModel`` and its tokenizer. Offline, give a local
            folder; set ``HF_HUB_OFFLINE=1`` so that an uncached hub name fails at once instead of retrying.
        pooling: ``"cls"`` (pooler output) or ``"cls_before_pooler"`` (last hidden state at the first position).
        batch_size: texts encoded per forward.
        max_length: longer texts are truncated to this many tokens.
        device: where the encoder runs, e.g. ``"cpu"`` or ``"cuda"``.
    """

    def __init__(
        self,
        name_or_path: str = "princeton-nlp/sup-simcse-bert-base-uncased",
        pooling: Literal["cls", "cls_before_pooler"] = "cls",
        batch_size: int = 32,
        max_length: int = 256,
        device: Optional[str] = None,
    ) -> None:
        from transformers import AutoModel, AutoTokenizer

        if pooling not in ("cls", "cls_before_pooler"):
            raise ValueError(f"`pooling={pooling!r}`: choose 'cls' (supervised SimCSE) or 'cls_before_pooler'.")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        except OSError as error:
            raise ValueError(
                f"`name_or_path={name_or_path!r}` could not be loaded ({error}). Offline, give a local folder with "
                "a saved model and tokenizer (`save_pretrained`)."
            ) from None
        self.model = build_model(AutoModel, name_or_path, None, True, None, "name_or_path")
        if pooling == "cls" and getattr(self.model, "pooler", None) is None:
            raise ValueError(f"`pooling='cls'`: {type(self.model).__name__} has no pooler; use 'cls_before_pooler'.")
        self.model.to(device or "cpu").eval()
        self.pooling = pooling
        self.batch_size = batch_size
        self.max_length = max_length

    @torch.no_grad()
    def __call__(self, texts: list[str]) -> Tensor:
        """Embeddings ``(N, d)`` of ``N`` texts, on the CPU in float32."""
        device = next(self.model.parameters()).device
        embeddings = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                list(texts[start : start + self.batch_size]),
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(device)
            output = self.model(**batch)
            pooled = output.pooler_output if self.pooling == "cls" else output.last_hidden_state[:, 0]
            embeddings.append(pooled.float().cpu())
        return torch.cat(embeddings) if embeddings else torch.empty(0, self.model.config.hidden_size)
