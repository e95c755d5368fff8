"""Exact block Jacobians: against autograd through the whole model's forward, and on blocks with known Jacobians."""

import pytest
import torch
from tiny_models import tiny_config, tiny_inputs, tiny_model
from torch import nn
from transformers import AutoModelForCausalLM

from layerwise.features.jacobian import block_jacobian, diagonal_jacobians, trace_blocks
from layerwise.features.paths import TIMM_VIT, get_blocks, layer_paths

FAMILIES = [
    (TIMM_VIT, "cls"),
    ("bert", "base"),
    ("gpt2", "causal_lm"),
    ("gpt_neox", "causal_lm"),
    ("llama", "causal_lm"),
]
FAMILIES += [("mistral", "base"), ("qwen2", "causal_lm")]


# The one-token path takes reverse-mode products, the whole prompt forward-mode ones. LLaMA's RMSNorm (and Mistral's,
# Qwen2's) computes in float32 even in a float64 model, so there the two round differently (at most 8e-9 measured);
# elsewhere they agree to float64 rounding.
SPLIT_ATOL = {"llama": 1e-7, "mistral": 1e-7, "qwen2": 1e-7}


def one_prompt(family: str) -> dict:
    return {key: value[:1] for key, value in tiny_inputs(family).items()}


def run(model: nn.Module, batch: dict) -> None:
    if "x" in batch:
        model(batch["x"].to(next(model.parameters()).dtype))
    else:
        model(**batch)


def reference_jacobian(model: nn.Module, blocks, layer: int, batch: dict, t1: int, t2: int) -> torch.Tensor:
    """d (block output - block input)[t2] / d input[t1] by torch.autograd.functional.jacobian of the model's forward.

    A pre-hook puts the variable into block ``layer``'s input at token t1; the model's own forward computes the
    masks and position embeddings; an output hook takes the block output (and stops the pass there).
    """

    class Stop(Exception):
        pass

    def function(x: torch.Tensor) -> torch.Tensor:
        seen = {}

        def put(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            one_hot = torch.zeros(hidden.shape[1], 1, dtype=hidden.dtype)
            one_hot[t1] = 1.0
            hidden = hidden + one_hot * (x - hidden[0, t1])
            seen["input"] = hidden
            return ((hidden, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": hidden})

        def take(module, args, output):
            seen["output"] = output[0] if isinstance(output, tuple) else output
            raise Stop

        handles = [
            blocks[layer].register_forward_pre_hook(put, with_kwargs=True),
            blocks[layer].register_forward_hook(take),
        ]
        try:
            run(model, batch)
        except Stop:
            pass
        finally:
            for handle in handles:
                handle.remove()
        return seen["output"][0, t2] - seen["input"][0, t2]

    with torch.no_grad():
        start = {}

        def keep(module, args, kwargs):
            start.setdefault("x", (args[0] if args else kwargs["hidden_states"])[0, t1].clone())

        handle = blocks[layer].register_forward_pre_hook(keep, with_kwargs=True)
        run(model, batch)
        handle.remove()
    return torch.autograd.functional.jacobian(function, start["x"])


@pytest.mark.parametrize(("family", "task"), FAMILIES, ids=[f for f, _ in FAMILIES])
def test_fast_jacobian_equals_autograd_of_the_whole_forward(family, task):
    model = tiny_model(family, task).double().eval()
    blocks = get_blocks(model, layer_paths(model))
    batch = one_prompt(family)
    trace = trace_blocks(blocks, lambda: run(model, batch))
    num_tokens = trace.calls[0].inputs.shape[0]
    for layer, t1, t2 in ((0, num_tokens - 1, num_tokens - 1), (1, 1, num_tokens - 1), (2, 2, 2)):
        fast = block_jacobian(blocks[layer], trace.calls[layer], t1)  # (T, d, d), all output tokens
        chunked = block_jacobian(blocks[layer], trace.calls[layer], t1, chunk_size=5)  # 5 JVPs at a time
        torch.testing.assert_close(chunked, fast, rtol=0, atol=1e-12)
        expected = reference_jacobian(model, blocks, layer, batch, t1, t2)
        # The attention kernels themselves differ by ~1e-8 in float64 (HF's eager softmax runs in float32).
        torch.testing.assert_close(fast[t2], expected, rtol=0, atol=1e-6)
        assert fast[t2].abs().max() > 1e-5
    causal = family not in (TIMM_VIT, "bert")
    upper = block_jacobian(blocks[1], trace.calls[1], 3)
    assert (upper[:3].abs().max() == 0) == causal  # J_{3 -> t2} = 0 for t2 < 3 in a causal model only


def test_float32_model_and_bf16_copy():
    model = tiny_model("llama", "causal_lm").eval()
    blocks = get_blocks(model, layer_paths(model))
    batch = one_prompt("llama")
    exact = diagonal_jacobians(blocks, trace_blocks(blocks, lambda: run(model, batch)))
    assert exact.dtype == torch.float32 and exact.shape == (3, 32, 32)
    model64 = tiny_model("llama", "causal_lm").double().eval()
    blocks64 = get_blocks(model64, layer_paths(model64))
    exact64 = diagonal_jacobians(blocks64, trace_blocks(blocks64, lambda: run(model64, batch)))
    torch.testing.assert_close(exact.double(), exact64, rtol=0, atol=1e-5)
    half = tiny_model("llama", "causal_lm").to(torch.bfloat16).eval()
    blocks16 = get_blocks(half, layer_paths(half))
    jacobians = diagonal_jacobians(blocks16, trace_blocks(blocks16, lambda: run(half, batch)))
    assert jacobians.dtype == torch.float32 and half.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    assert (jacobians - exact).abs().max() < 0.1 * exact.abs().max()  # bf16 inputs, float32 Jacobian


class TokenLinear(nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x @ self.weight.T  # f(X) = X W^T, plus the skip


def test_token_wise_linear_blocks():
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(6, 6, generator=g, dtype=torch.float64) for _ in range(3)]
    blocks = nn.Sequential(*[TokenLinear(w) for w in weights])
    x = torch.randn(1, 5, 6, generator=g, dtype=torch.float64)
    trace = trace_blocks(blocks, lambda: blocks(x))
    for layer, weight in enumerate(weights):
        jacobians = block_jacobian(blocks[layer], trace.calls[layer], 2)
        torch.testing.assert_close(jacobians[2], weight, rtol=0, atol=1e-12)  # J_tt = W
        assert jacobians[[0, 1, 3, 4]].abs().max() == 0  # J_{t1 != t2} = 0
    torch.testing.assert_close(diagonal_jacobians(blocks, trace), torch.stack(weights), rtol=0, atol=1e-12)
    torch.testing.assert_close(trace.trajectory[-1], blocks(x)[0])


def test_dropout_must_be_off_and_batches_are_refused():
    block = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    blocks = nn.ModuleList([block])
    trace = trace_blocks(blocks, lambda: block(torch.randn(1, 3, 4)))
    block.train()
    block_jacobian(block, trace.calls[0], 0)  # run in eval mode: dropout is off
    assert block.training  # and the mode is restored
    with pytest.raises(ValueError, match="one prompt at a time"):
        trace_blocks(blocks, lambda: block(torch.randn(2, 3, 4)))


@pytest.mark.parametrize("mode", ["self", "fixed_input", "fixed_output"])
def test_token_wise_coupling_modes_equal_a_direct_computation(mode):
    from layerwise.engines.coupling import token_coupling
    from layerwise.metrics.functional_dynamics import mis_coupling

    model = tiny_model("gpt2", "causal_lm").double().eval()
    blocks = get_blocks(model, layer_paths(model))
    batch = one_prompt("gpt2")
    trace = trace_blocks(blocks, lambda: run(model, batch))
    num_tokens = trace.calls[0].inputs.shape[0]
    matrix = token_coupling(blocks, trace, 0, 2, mode, k=4)
    assert matrix.shape == (num_tokens, num_tokens)

    def jacobian(layer: int, t: int) -> torch.Tensor:  # the Jacobian the mode pairs at index t
        t1, t2 = {"self": (t, t), "fixed_input": (0, t), "fixed_output": (t, num_tokens - 1)}[mode]
        return block_jacobian(blocks[layer], trace.calls[layer], t1, out_tokens=[t2])[0]

    for t, t_prime in ((0, 0), (1, 4), (num_tokens - 1, 2)):
        expected = mis_coupling(jacobian(0, t), jacobian(2, t_prime), 4)
        torch.testing.assert_close(matrix[t, t_prime], expected, rtol=1e-9, atol=1e-12)


def test_token_wise_self_coupling_of_token_linear_blocks_is_zero():
    from layerwise.engines.coupling import token_coupling

    weight = torch.randn(6, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    blocks = nn.Sequential(TokenLinear(weight), TokenLinear(2.0 * weight))  # same bases, scaled singular values
    x = torch.randn(1, 5, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    trace = trace_blocks(blocks, lambda: blocks(x))
    assert token_coupling(blocks, trace, 0, 1, "self", k=3).abs().max() < 1e-12


def test_jacobian_memory_is_bounded_by_the_chunk_size():
    """The products keep no graph beyond the one-token run's, so the peak follows the basis vectors run at once
    (chunk_size), not d."""
    from helpers import memory_benchmark

    memory = memory_benchmark()

    torch.manual_seed(0)
    config = tiny_config("gpt2", n_layer=1, n_embd=128, vocab_size=100)
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, 100, (1, 48), generator=torch.Generator().manual_seed(0))
    trace = trace_blocks(model.transformer.h, lambda: model(input_ids=ids, use_cache=False))
    peaks = {}
    for chunk in (None, 8):
        with memory.MemoryTracker() as tracker:
            block_jacobian(model.transformer.h[0], trace.calls[0], -1, [47], chunk_size=chunk)
        peaks[chunk] = tracker.peak_bytes
    activations = 128 * 48 * 4 * 128  # d tangents x one (T, 4d) float32 MLP activation: 3 MiB
    assert peaks[None] < 40 * activations  # the tangents through the block, no graph on top (158 MB before)
    # 8 of 128 basis vectors at a time; what stays is the one-token run's graph and the other tokens' keys/values
    # (measured: 1.38 MB with all 128, 0.54 MB with 8; forward mode took 5.06 and 0.69 MB)
    assert peaks[8] < peaks[None] / 2


@pytest.mark.parametrize(("family", "task"), FAMILIES, ids=[f for f, _ in FAMILIES])
def test_one_token_jacobian_equals_autograd_of_the_whole_forward(family, task, recwarn):
    """J_tt from the block run on token t alone, the other tokens' keys/values fixed (issue 24.2): last, middle and
    first token, every family (RoPE and grouped KV in LLaMA/Mistral/Qwen2, bidirectional BERT and ViT)."""
    from layerwise.features.jacobian import diagonal_block_jacobian

    model = tiny_model(family, task).double().eval()
    blocks = get_blocks(model, layer_paths(model))
    batch = one_prompt(family)
    trace = trace_blocks(blocks, lambda: run(model, batch))
    num_tokens = trace.calls[0].inputs.shape[0]
    for layer, token in ((0, num_tokens - 1), (1, num_tokens // 2), (2, 0)):
        one_token = diagonal_block_jacobian(blocks[layer], trace.calls[layer], token)
        whole = block_jacobian(blocks[layer], trace.calls[layer], token, [token], method="full")[0]
        torch.testing.assert_close(one_token, whole, rtol=0, atol=SPLIT_ATOL.get(family, 1e-12))
        expected = reference_jacobian(model, blocks, layer, batch, token, token)
        torch.testing.assert_close(one_token, expected, rtol=0, atol=1e-6)  # HF's eager softmax runs in float32
        assert one_token.abs().max() > 1e-5
    assert not [w for w in recwarn.list if "Jacobian on the whole prompt" in str(w.message)]  # no fallback taken


def test_one_token_split_reuses_the_trace_row_and_stops_the_whole_prompt_run_at_attention():
    """The trace's row spares the split its whole-prompt run past the attention call (no MLP on every token); a
    wrong row is caught by the check and the block is split with its own whole-prompt run, to the same Jacobian."""
    from layerwise.features.jacobian import diagonal_block_jacobian
    from layerwise.features.token_rows import SplitBlock, split_block

    model = tiny_model("gpt2", "causal_lm").double().eval()
    blocks = get_blocks(model, layer_paths(model))
    trace = trace_blocks(blocks, lambda: run(model, one_prompt("gpt2")))
    call, block, token = trace.calls[1], blocks[1], 3
    mlp_tokens = []
    handle = block.mlp.register_forward_hook(lambda module, args, output: mlp_tokens.append(args[0].shape[1]))
    try:
        fast = diagonal_block_jacobian(block, call, token)
        assert mlp_tokens == [1]  # the one-token run only: the whole-prompt run stopped at its attention call
        mlp_tokens.clear()
        wrong = call.outputs[token] - call.inputs[token] + 1.0
        split = split_block(block, call.inputs, call.args, call.kwargs, token, wrong)
        assert isinstance(split, SplitBlock)
        assert mlp_tokens == [1, call.inputs.shape[0], 1]  # refused against the wrong row, then split whole
    finally:
        handle.remove()
    (rows,) = torch.func.vmap(split.pullback)(torch.eye(call.inputs.shape[1], dtype=torch.float64))
    torch.testing.assert_close(rows, fast, rtol=0, atol=0)
    whole = block_jacobian(block, call, token, [token], method="full")[0]
    torch.testing.assert_close(fast, whole, rtol=0, atol=1e-12)
