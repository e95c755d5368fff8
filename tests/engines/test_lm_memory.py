"""Vocabulary-scale memory: no layers x tokens x vocabulary tensor, and the extra peak within the documented bound.

A tiny GPT-2 (3 layers, width 32) with the real 50,257-token vocabulary and ``chunk_size=16`` over 96 rows, so every
layer's head runs in six chunks. Every tensor any aten op returns is recorded (a ``TorchDispatchMode``, which also sees
the backward pass and the recomputation of checkpointed chunks); peaks come from the CPU allocator's own events.
The tracker is ``benchmarks/_memory.py``, checked here first on a matmul chain whose peak is counted by hand.
"""

import math

import pytest
import torch
from helpers import memory_benchmark
from tiny_models import tiny_overrides
from torch.utils.checkpoint import checkpoint

from layerwise.engines.readout import chunked_cross_entropy
from layerwise.features import FEATURES, HFCausalLM
from layerwise.lightning_modules import Aligned, MultiExit, Standard

memory = memory_benchmark()

VOCAB, LAYERS, WIDTH, SEQ, BATCH, CHUNK = 50257, 3, 32, 48, 2, 16
ROWS = BATCH * SEQ  # training rows: every position (the last one's target is -100)
KEPT = BATCH * (SEQ - 1)  # analysis rows: the positions that predict a token


def gpt2(layers: int = LAYERS) -> HFCausalLM:
    torch.manual_seed(0)
    config = tiny_overrides(
        "gpt2",
        n_layer=layers,
        n_embd=WIDTH,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    backbone = HFCausalLM(model_type="gpt2", config_overrides=config)
    assert (backbone.num_layers, backbone.embed_dim, backbone.vocab_size) == (layers, WIDTH, VOCAB)
    return backbone


def token_batch() -> dict:
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


def train_step(module, batch, loss=None) -> None:
    """Forward and backward; no gradients before or after, so every tracked step starts from the same state."""
    module.zero_grad(set_to_none=True)
    outputs = module.samples(batch)
    (module.compute_loss(outputs) if loss is None else loss(outputs)).backward()
    module.zero_grad(set_to_none=True)


def tracked(run, keep_all: bool = True):
    with memory.MemoryTracker("cpu", keep_all=keep_all) as tracker:
        run()
    return tracker


def backbone_only(module, batch) -> None:
    train_step(module, batch, lambda outputs: outputs[FEATURES].sum())


# ------------------------------------------------------------------------------------------------- the tracker
@pytest.mark.parametrize("checkpointed", [False, True])
def test_tracker_counts_saved_and_recomputed_tensors_of_a_matmul_chain(checkpointed):
    """``a = x W0``, ``c = (a W1) W2`` with a frozen ``W1`` (n, 4n): the peak counted by hand, in n x n blocks.

    Forward: ``a`` (1; no op saves it, since ``x`` and ``W1`` need no gradient, but the checkpoint keeps it to
    recompute from), ``b = a W1`` (4: saved, or freed and recomputed in backward when checkpointed), ``c`` (1).
    Backward of ``b W2``: ``grad_b`` (4) and ``grad_W2`` (4) next to ``b`` and ``c``: 13, plus ``a`` when
    checkpointed: the peak; then ``b`` is freed. Backward of ``a W1`` adds ``grad_a`` (1), of ``x W0`` ``grad_W0``
    (1). At the end the two weight gradients remain: 1 + 4. Missing the recomputed ``b`` would read 10, not 14.
    """
    n = 64
    block = 4 * n * n
    torch.manual_seed(0)
    x, w1, grad_c = torch.randn(n, n), torch.randn(n, 4 * n), torch.randn(n, n)
    w0, w2 = torch.randn(n, n, requires_grad=True), torch.randn(4 * n, n, requires_grad=True)

    def chain(a):
        return (a @ w1) @ w2

    def run():
        a = x @ w0
        c = checkpoint(chain, a, use_reentrant=False) if checkpointed else chain(a)
        del a
        c.backward(grad_c)

    tracker = tracked(run)
    peak = (13 + checkpointed) * block
    bookkeeping = 64 * 1024 if checkpointed else 0  # the checkpoint's own small tensors (20 KiB here)
    assert peak <= tracker.peak_bytes <= peak + bookkeeping
    assert tracker.op_peak_bytes == peak
    assert tracker.end_bytes == 5 * block
    wide = [r for r in tracker.records if r.op == "mm" and r.new and r.shape == (n, 4 * n)]
    assert len(wide) == 2 + checkpointed  # b and grad_b, plus the recomputed b
    assert tracker.largest_new.nbytes == 4 * block


# --------------------------------------------------------------------------------------- tensors ever allocated
def assert_no_vocabulary_scale_tensor(records, rows: int, allow_weight_grads: bool) -> None:
    """No tensor with >= half of L x N x V elements; every tensor with a V axis is one chunk of logits or of their
    gradient (<= c x V elements, also transposed for the weight's gradient), a view of a (V, d) head weight (its
    transpose in ``F.linear``) or, with gradients, a new (V, d) gradient of a head or of the embedding
    (``embedding_dense_backward``, or autograd's sum of the tied weight's gradients)."""
    assert records
    limit = LAYERS * rows * VOCAB // 2
    too_big = [str(r) for r in records if r.numel >= limit]
    assert not too_big, too_big
    vocabulary = [r for r in records if VOCAB in r.shape]
    chunks = [r for r in vocabulary if r.numel <= CHUNK * VOCAB]
    weights = [r for r in vocabulary if sorted(r.shape) == [WIDTH, VOCAB] and (allow_weight_grads or not r.new)]
    others = [str(r) for r in vocabulary if r not in chunks and r not in weights]
    assert not others, others
    assert max(r.numel for r in chunks) == CHUNK * VOCAB


def chunk_logits(records) -> int:
    """How many (c, V) logits the head's matmul produced: one per chunk forward, one per recomputation."""
    return sum(r.op == "mm" and r.new and r.shape == (CHUNK, VOCAB) for r in records)


@pytest.mark.parametrize(
    "strategy, trained_layers",
    [
        (lambda backbone: Aligned(backbone, chunk_size=CHUNK), LAYERS),
        (lambda backbone: Aligned(backbone, sampled_exits=1, chunk_size=CHUNK), 2),
        (lambda backbone: MultiExit(backbone, chunk_size=CHUNK), LAYERS),
    ],
    ids=["Aligned", "Aligned(sampled_exits=1)", "MultiExit"],
)
def test_training_step_never_allocates_a_layers_tokens_vocabulary_tensor(strategy, trained_layers):
    module = strategy(gpt2())
    tracker = tracked(lambda: train_step(module, token_batch()))
    assert_no_vocabulary_scale_tensor(tracker.records, ROWS, allow_weight_grads=True)
    chunks = math.ceil(ROWS / CHUNK)
    assert chunk_logits(tracker.records) == 2 * trained_layers * chunks  # forward, then recomputed in backward


@pytest.mark.parametrize("strategy", [Standard, MultiExit], ids=["shared head", "MultiExit (exit heads too)"])
def test_analysis_never_allocates_a_layers_tokens_vocabulary_tensor(strategy):
    module = strategy(gpt2(), chunk_size=CHUNK)
    tracker = tracked(lambda: module.layer_outputs(token_batch()))
    assert_no_vocabulary_scale_tensor(tracker.records, KEPT, allow_weight_grads=False)
    # full chunks: the shared head reads the layers' rows as one stream, separate exit heads one layer at a time
    exits = LAYERS * (KEPT // CHUNK) if strategy is MultiExit else 0
    assert chunk_logits(tracker.records) == (LAYERS * KEPT) // CHUNK + exits


# --------------------------------------------------------------------------------------------- peak within bound
@pytest.mark.parametrize("sampled_exits", [None, 1], ids=["Aligned", "Aligned(sampled_exits=1)"])
def test_training_step_extra_peak_within_documented_bound(sampled_exits):
    module = Aligned(gpt2(), sampled_exits=sampled_exits, chunk_size=CHUNK)
    batch = token_batch()
    reference = tracked(lambda: backbone_only(module, batch), keep_all=False)
    step = tracked(lambda: train_step(module, batch), keep_all=False)
    extra = step.peak_bytes - reference.peak_bytes
    bound = sum(memory.training_bound(VOCAB, WIDTH, LAYERS, ROWS, CHUNK).values())
    assert CHUNK * VOCAB * 4 <= extra <= bound, (extra, bound)


def test_analysis_extra_peak_within_documented_bound():
    module = Standard(gpt2(), chunk_size=CHUNK)
    batch = token_batch()
    reference = tracked(lambda: torch.no_grad()(module.samples)(batch), keep_all=False)
    step = tracked(lambda: module.layer_outputs(batch), keep_all=False)
    extra = step.peak_bytes - reference.peak_bytes
    bound = sum(memory.analysis_bound(VOCAB, WIDTH, LAYERS, KEPT, CHUNK).values())
    assert CHUNK * VOCAB * 4 <= extra <= bound, (extra, bound)


def test_aligned_extra_peak_does_not_grow_with_layers_when_a_layer_fits_in_one_chunk():
    layers = 6
    module = Aligned(gpt2(layers), chunk_size=ROWS)  # the library's default 1024 >= B x T is the common case
    batch = token_batch()
    reference = tracked(lambda: backbone_only(module, batch), keep_all=False)
    step = tracked(lambda: train_step(module, batch), keep_all=False)
    bound = sum(memory.training_bound(VOCAB, WIDTH, layers, ROWS, ROWS).values())
    assert step.peak_bytes - reference.peak_bytes <= bound


# ----------------------------------------------------------------------------------- chunked == unchunked loss
def reference_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, smoothing: float) -> torch.Tensor:
    """Mean over rows with a target of ``-(1-ε) log p_y - ε/C Σ_j log p_j``, written out in float64."""
    keep = targets != -100
    log_p = logits[keep] - torch.logsumexp(logits[keep], dim=-1, keepdim=True)
    per_row = -(1 - smoothing) * log_p.gather(1, targets[keep, None]).squeeze(1) - smoothing * log_p.mean(-1)
    return per_row.sum() / keep.sum()


def loss_and_gradients(chunk_size, features, targets, head, smoothing):
    features = features.detach().requires_grad_()
    head.zero_grad(set_to_none=True)
    if chunk_size is None:
        loss = reference_cross_entropy(head(features), targets, smoothing)
    else:
        loss = chunked_cross_entropy(head, features, targets, chunk_size, smoothing)
    loss.backward()
    return loss, [features.grad, *(p.grad for p in head.parameters())]


def loss_problem():
    torch.manual_seed(0)
    rows, width, classes = 23, 6, 11
    head = torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, classes)).double()
    features = torch.randn(rows, width, dtype=torch.float64)
    targets = torch.randint(0, classes, (rows,))
    targets[[5, 6, 7, 12, 16]] = -100  # ignored rows inside chunks and across chunk borders
    return features, targets, head


@pytest.mark.parametrize("chunk_size", [1, 7, 23, 28], ids=["1", "7", "N", "N+5"])
def test_chunked_loss_and_gradients_equal_the_unchunked_loss_in_float64(chunk_size):
    features, targets, head = loss_problem()
    expected, expected_grads = loss_and_gradients(None, features, targets, head, 0.1)
    loss, grads = loss_and_gradients(chunk_size, features, targets, head, 0.1)
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-10)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-10)
