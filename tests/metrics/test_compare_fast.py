"""``precision="fast"`` of the cross-model CKA: float32 products, float64 sums, within its stated error of the exact."""

import numpy as np
import pytest
import torch
from test_compare_metrics import features, ref_cka
from tiny_models import tiny_config

from layerwise.metrics.compare import CrossModelCKA

N, LA, DA, LB, DB = 600, 3, 48, 4, 40
STATED_ERROR = 1e-4  # the bound the docstrings and docs/compare.md state for precision="fast"


def model_like_pair(offset: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Features sharing a signal, with outlier dimensions (as GPT-2's residual stream has) and an offset."""
    shared = torch.randn(N, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a, b = features(1, LA, DA, n=N, shared=shared), features(2, LB, DB, n=N, shared=shared)
    a[:, :, 3] *= 40.0
    b[:, :, 7] = 25.0 * b[:, :, 7] + 300.0
    return a + offset, b - offset


def streamed(a: torch.Tensor, b: torch.Tensor, pairs: str = "all", **options) -> torch.Tensor:
    metric = CrossModelCKA(a.shape[0], a.shape[2], b.shape[0], b.shape[2], pairs=pairs, **options)
    for start in range(0, N, 128):  # uneven batches: 4 of 128 tokens and one of 88
        metric.update(a[:, start : start + 128], b[:, start : start + 128])
    return metric.compute()


@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_fast_precision_is_within_its_stated_error_of_numpy(offset):
    a64, b64 = model_like_pair(offset)
    a, b = a64.float(), b64.float()  # what a float32 model hands over
    expected = np.array([[ref_cka(a[i].double().numpy(), b[j].double().numpy()) for j in range(LB)] for i in range(LA)])
    fast = streamed(a, b, precision="fast")
    assert fast.dtype == torch.float64
    error = np.abs(fast.numpy() - expected).max()
    assert error <= STATED_ERROR, error
    exact_error = np.abs(streamed(a, b).numpy() - expected).max()
    assert exact_error <= 1e-9, exact_error
    # the fast path really runs in float32: its error is above the float64 path's rounding
    assert error > exact_error


def test_fast_precision_diagonal_pairs_and_half_precision_features():
    a64, b64 = model_like_pair(0.0)
    b64 = b64[:LA]
    for dtype in (torch.float32, torch.bfloat16):
        a, b = a64.to(dtype), b64.to(dtype)
        expected = [ref_cka(a[i].double().numpy(), b[i].double().numpy()) for i in range(LA)]
        diagonal = streamed(a, b, pairs="diagonal", precision="fast")
        np.testing.assert_allclose(diagonal.diagonal().numpy(), expected, rtol=0, atol=STATED_ERROR)
        np.testing.assert_allclose(streamed(a, b, precision="fast").diagonal().numpy(), expected, atol=STATED_ERROR)


def test_fast_precision_states_merge_like_the_exact_ones():
    a, b = (x.float() for x in model_like_pair(1e3))
    whole, first, second = (CrossModelCKA(LA, DA, LB, DB, precision="fast") for _ in range(3))
    whole.update(a, b)
    first.update(a[:, :250], b[:, :250])
    second.update(a[:, 250:], b[:, 250:])
    first.merge_state(second)
    torch.testing.assert_close(first.compute(), whole.compute(), rtol=0, atol=STATED_ERROR)


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision"):
        CrossModelCKA(LA, DA, LB, DB, precision="float16")


def test_compare_models_and_the_command_take_the_fast_precision(tmp_path):
    import json

    from transformers import AutoModelForCausalLM

    from layerwise.cli import main as cli_main
    from layerwise.engines.compare import compare_models

    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        config = tiny_config("gpt2", n_layer=2, vocab_size=260)
        models.append(AutoModelForCausalLM.from_config(config).eval())
    batches = [
        {"input_ids": torch.randint(0, 260, (2, 24), generator=torch.Generator().manual_seed(i))} for i in range(3)
    ]
    exact = compare_models(models[0].base_model, models[1].base_model, batches)
    fast = compare_models(models[0].base_model, models[1].base_model, batches, precision="fast")
    assert fast["precision"] == "fast" and exact["precision"] == "exact"
    error = float((fast["cka"] - exact["cka"]).abs().max())
    assert 0 < error <= STATED_ERROR, error

    folder = tmp_path / "byte_gpt2"
    models[1].save_pretrained(folder)
    text = tmp_path / "text.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(80)))
    argv = ["compare", "--model_a", str(folder), "--model_b", str(folder), "--text", str(text), "--tokenizer", "byte"]
    cli_main([*argv, "--block_size", "16", "--max_blocks", "8", "--precision", "fast", "--out", str(tmp_path / "o")])
    record = json.loads((tmp_path / "o" / "compare.json").read_text())
    assert record["precision"] == "fast" and all(abs(record["cka"][i][i] - 1) < 1e-5 for i in range(2))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("into", [torch.float64, torch.float32])
def test_token_rows_are_the_float64_difference_rounded_once(dtype, into):
    from layerwise.metrics.compare import _rows_minus

    features = (torch.randn(3, 7, 5, generator=torch.Generator().manual_seed(3)) * 40 + 1e3).to(dtype)
    shift = torch.randn(15, generator=torch.Generator().manual_seed(4), dtype=torch.float64) + 1e3
    expected = (features.double().transpose(0, 1).reshape(7, 15) - shift).to(into)
    rows = _rows_minus(features, shift, into)
    assert rows.dtype == into and rows.shape == (7, 15) and rows.is_contiguous()
    assert torch.equal(rows, expected)


def test_compare_models_runs_the_language_models_without_a_kv_cache():
    from transformers import AutoModelForCausalLM

    from layerwise.engines.compare import compare_models

    seen = []
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        config = tiny_config("gpt2", n_layer=2, vocab_size=260)
        model = AutoModelForCausalLM.from_config(config).base_model.eval()
        model.register_forward_pre_hook(
            lambda module, args, kwargs: seen.append(kwargs.get("use_cache")), with_kwargs=True
        )
        models.append(model)
    batches = [
        {"input_ids": torch.randint(0, 260, (2, 24), generator=torch.Generator().manual_seed(i))} for i in range(2)
    ]
    results = compare_models(*models, batches)
    assert seen == [False] * 4
    assert results["num_tokens"] == 96


@pytest.mark.parametrize("pairs", ["all", "diagonal"])
def test_fast_products_reuse_one_scratch_buffer_across_batches_and_blocks(monkeypatch, pairs):
    """Every float32 product lands in one buffer kept from batch to batch (blocks of 50 rows: 50, 50, 44), with the
    same states as products written to fresh tensors; reset drops the buffer."""
    import layerwise.metrics.compare as compare

    a, b = (x.float() for x in model_like_pair(1e3))
    b = b[:LA] if pairs == "diagonal" else b
    monkeypatch.setattr(compare, "_FAST_ROWS", 50)
    metric = CrossModelCKA(LA, DA, b.shape[0], DB, pairs=pairs, precision="fast")
    metric.update(a[:, :128], b[:, :128])
    buffer = metric._buffer
    assert buffer is not None and buffer.dtype == torch.float32
    metric.update(a[:, 128:], b[:, 128:])
    assert metric._buffer.data_ptr() == buffer.data_ptr()  # no new allocation at the second batch

    reference = CrossModelCKA(LA, DA, b.shape[0], DB, pairs=pairs, precision="fast")
    monkeypatch.setattr(reference, "_scratch", lambda shape, like: torch.empty(shape, dtype=like.dtype))
    reference.update(a[:, :128], b[:, :128])
    reference.update(a[:, 128:], b[:, 128:])
    for name in ("self_a", "self_b", "cross"):
        torch.testing.assert_close(getattr(metric, name), getattr(reference, name), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(metric.compute(), reference.compute(), rtol=0, atol=1e-9, equal_nan=True)
    metric.reset()
    assert metric._buffer is None
