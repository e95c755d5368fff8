"""One evaluation step's outputs -> LayerBatch: the sampler's padding dropped, and no device read without a budget."""

import pytest
import torch

from layerwise.callbacks import _batch
from layerwise.features import FEATURES, LOGITS, SAMPLE_INDEX, TARGETS


def outputs() -> dict:
    """Three samples of two token rows each (a language model's rows), 2 layers, d = 4, 5 classes."""
    generator = torch.Generator().manual_seed(0)
    return {
        FEATURES: torch.randn(2, 6, 4, generator=generator),
        LOGITS: torch.randn(2, 6, 5, generator=generator),
        TARGETS: torch.tensor([0, 1, 2, 3, 4, 0]),
        SAMPLE_INDEX: torch.tensor([0, 0, 1, 1, 2, 2]),
    }


def test_a_budget_drops_the_padding_samples_and_counts_the_real_ones():
    batch, used = _batch.layer_batch(outputs(), torch.tensor([0, 1]), budget=2, token_stride=1)
    assert used == 2
    torch.testing.assert_close(batch.features, outputs()[FEATURES][:, :4])
    assert batch.targets.tolist() == [0, 1, 2, 3]


def test_without_a_budget_nothing_is_counted_so_nothing_is_read_from_the_device(monkeypatch):
    def read(*args):
        raise AssertionError("counted the samples (a read of the device) although there is no budget")

    monkeypatch.setattr(_batch, "_samples_in", read)
    batch, used = _batch.layer_batch(outputs(), torch.tensor([1]), budget=None, token_stride=1)
    assert used == 0 and batch.features.shape == (1, 6, 4)
    with pytest.raises(AssertionError, match="no budget"):
        _batch.layer_batch(outputs(), torch.tensor([1]), budget=2, token_stride=1)
