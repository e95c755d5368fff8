"""Text-level metrics of generated continuations: rep-n, diversity and coherence (SimCTG / contrastive search).

These are the metrics of the generation table of the paper (GPT-2 generating from every layer), as defined by Su et
al. (SimCTG, 2022) and used by contrastive search and contrastive decoding:

- ``rep-n = 1 - |unique n-grams| / |n-grams|`` of a continuation (the fraction of repeated n-grams);
- ``diversity = (1 - rep-2) (1 - rep-3) (1 - rep-4)``;
- ``coherence = mean cos(emb(prefix), emb(continuation))`` with a SimCSE sentence encoder.

Tokens are the whitespace-separated words of the continuation alone (``text.strip().split()``, as in SimCTG's
evaluation script), not the model's subword tokens, so the numbers compare across tokenizers. Over a corpus, rep-n
follows SimCTG's ``measure_repetition_and_diversity``: unique n-grams are counted within each continuation, and
the unique counts and the n-gram counts are each summed over continuations before dividing. An n-gram that appears
once in each of two continuations is therefore not a repetition (it is not a pooled set over the corpus), and long
continuations weigh more than short ones (it is not a mean of per-text ratios). Papers report these as percentages.
"""

from collections.abc import Callable, Sequence
from typing import Union

import torch
from torch import Tensor

Texts = Union[Sequence[str], Sequence[Sequence[str]]]
Encoder = Callable[[list[str]], Tensor]


def words(text: str) -> list[str]:
    """The whitespace tokens of a text, the unit of rep-n and diversity."""
    return text.strip().split()


def _ngram_counts(tokens: Sequence[str], n: int) -> tuple[int, int]:
    """Number of unique n-grams and of all n-grams (``len(tokens) - n + 1``) of one token sequence."""
    if n < 1:
        raise ValueError(f"`n={n}`: n-grams need n >= 1.")
    ngrams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(ngrams)), len(ngrams)


def rep_n(tokens: Sequence[str], n: int) -> float:
    """Fraction of repeated n-grams of one token sequence: ``1 - |unique n-grams| / |n-grams|``.

    Args:
        tokens: one continuation as a sequence of tokens (e.g. :func:`words` of its text).
        n: n-gram length.

    Returns:
        A value in ``[0, 1)``; 0 when the sequence is shorter than ``n`` (no n-grams).
    """
    unique, total = _ngram_counts(tokens, n)
    return 0.0 if total == 0 else 1.0 - unique / total


def _as_token_lists(texts: Texts) -> list[Sequence[str]]:
    """Strings are split on whitespace; token sequences are kept."""
    if isinstance(texts, str):
        raise TypeError("Give a list of continuations, not one string (wrap it: `[text]`).")
    return [words(text) if isinstance(text, str) else text for text in texts]


def corpus_rep_n(texts: Texts, n: int) -> float:
    """rep-n of a set of continuations: per-text unique n-gram counts summed, over the summed n-gram counts.

    Args:
        texts: continuations, each a string (split on whitespace) or a sequence of tokens.
        n: n-gram length.

    Returns:
        ``1 - sum_i unique_i / sum_i total_i``; 0 when no continuation has an n-gram.
    """
    unique, total = 0, 0
    for tokens in _as_token_lists(texts):
        text_unique, text_total = _ngram_counts(tokens, n)
        unique, total = unique + text_unique, total + text_total
    return 0.0 if total == 0 else 1.0 - unique / total


def diversity(texts: Texts) -> float:
    """SimCTG diversity of a set of continuations: ``prod_{n=2..4} (1 - rep-n)`` with :func:`corpus_rep_n`.

    Args:
        texts: continuations without their prefix, each a string (split on whitespace) or a sequence of tokens. For
            a single continuation, pass a one-element list.

    Returns:
        A value in ``(0, 1]``; 1 when no n-gram repeats within any continuation.
    """
    token_lists = _as_token_lists(texts)
    value = 1.0
    for n in (2, 3, 4):
        value *= 1.0 - corpus_rep_n(token_lists, n)
    return value


def coherence(prefixes: Sequence[str], continuations: Sequence[str], encoder: Encoder) -> float:
    """Mean cosine similarity between the embedding of each prefix and of its continuation (Su & Collier, 2022).

    Args:
        prefixes: the prompts, ``N`` strings.
        continuations: the generated text of each prompt, without the prompt, ``N`` strings.
        encoder: maps a list of strings to embeddings ``(N, d)``, e.g. a ``SentenceEncoder``
            (``layerwise.features.sentence_encoder``).

    Returns:
        ``mean_i cos(encoder(prefixes)_i, encoder(continuations)_i)`` in ``[-1, 1]``.
    """
    if isinstance(prefixes, str) or isinstance(continuations, str):
        raise TypeError("Give lists of prefixes and continuations, not single strings.")
    if len(prefixes) != len(continuations) or not prefixes:
        raise ValueError(
            f"coherence needs as many continuations as prefixes, at least one: got {len(prefixes)} prefixes and "
            f"{len(continuations)} continuations."
        )
    prefix_emb = encoder(list(prefixes))
    continuation_emb = encoder(list(continuations))
    if prefix_emb.dim() != 2 or prefix_emb.size(0) != len(prefixes) or prefix_emb.shape != continuation_emb.shape:
        raise ValueError(
            f"The encoder must return (N, d) embeddings for N={len(prefixes)} texts; got {tuple(prefix_emb.shape)} "
            f"for the prefixes and {tuple(continuation_emb.shape)} for the continuations."
        )
    cosine = torch.nn.functional.cosine_similarity(prefix_emb.double(), continuation_emb.double(), dim=-1)
    return float(cosine.mean())
