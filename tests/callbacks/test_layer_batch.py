"""One evaluation step's LayerOutputs -> the selected layers: the sampler's padding dropped, no device read without a
budget; batches joined into bounded groups."""

from typing import Optional

import pytest
import torch

from layerwise.analyses.layer_spec import LayerSpec
from layerwise.callbacks import LayerwiseAnalysis, _loader
from layerwise.callbacks._loader import LoaderState
from layerwise.engines.readout import LayerOutputs
from layerwise.metrics import Readout, readout_from_logits


def outputs() -> LayerOutputs:
    """Three samples of two token rows each (a language model's rows), 2 layers, d = 4, 5 classes."""
    generator = torch.Generator().manual_seed(0)
    features, logits = torch.randn(2, 6, 4, generator=generator), torch.randn(2, 6, 5, generator=generator)
    targets = torch.tensor([0, 1, 2, 3, 4, 0])
    return LayerOutputs(
        features, readout_from_logits(logits, targets), targets, sample_index=torch.tensor([0, 0, 1, 1, 2, 2])
    )


def test_a_budget_drops_the_padding_samples_and_counts_the_real_ones():
    batch, used = outputs().select(torch.tensor([0, 1]), budget=2, token_stride=1)
    assert used == 2
    torch.testing.assert_close(batch.features, outputs().features[:, :4])
    torch.testing.assert_close(batch.readout.nll, outputs().readout.nll[:, :4])
    assert batch.targets.tolist() == [0, 1, 2, 3] and batch.sample_index is None


def test_the_outputs_say_a_shape_that_breaks_the_contract():
    good = outputs()
    with pytest.raises(ValueError, match=r"features \(L, N, d\) and a readout of \(L, N\).*\(2, 6, 4\).*\(2, 5\)"):
        LayerOutputs(good.features, Readout(*(value[:, :5] for value in good.readout[:3])), good.targets)
    with pytest.raises(ValueError, match=r"targets of shape \(N,\) = \(6,\), got \(5,\)"):
        LayerOutputs(good.features, good.readout, good.targets[:5])


def test_without_a_budget_nothing_is_counted_so_nothing_is_read_from_the_device(monkeypatch):
    def read(*args):
        raise AssertionError("counted the samples (a read of the device) although there is no budget")

    monkeypatch.setattr(LayerOutputs, "_samples_in", read)
    batch, used = outputs().select(torch.tensor([1]), budget=None, token_stride=1)
    assert used == 0 and batch.features.shape == (1, 6, 4)
    with pytest.raises(AssertionError, match="no budget"):
        outputs().select(torch.tensor([1]), budget=2, token_stride=1)


def layer_batch(rows: int, seed: int, sampled: Optional[list[int]] = None) -> LayerOutputs:
    """A batch of ``rows`` samples, 2 layers, d = 4, with a shared readout and an exit readout without losses."""
    generator = torch.Generator().manual_seed(seed)
    readout = Readout(
        torch.randint(0, 5, (2, rows), generator=generator),
        torch.rand(2, rows, generator=generator),
        torch.rand(2, rows, generator=generator),
    )
    exits = Readout(torch.randint(0, 5, (2, rows), generator=generator), torch.rand(2, rows, generator=generator), None)
    return LayerOutputs(
        torch.randn(2, rows, 4, generator=generator),
        readout,
        torch.randint(0, 5, (rows,), generator=generator),
        exits,
        sampled=None if sampled is None else torch.tensor(sampled),
    )


def test_cat_joins_the_rows_in_order_and_renumbers_the_sampled_rows():
    batches = [layer_batch(3, 0, [0, 2]), layer_batch(2, 1, [1]), layer_batch(4, 2, [0, 3])]
    joined = LayerOutputs.cat(batches)
    torch.testing.assert_close(joined.features, torch.cat([batch.features for batch in batches], 1))
    torch.testing.assert_close(joined.targets, torch.cat([batch.targets for batch in batches]))
    for field in ("predictions", "max_prob", "nll"):
        expected = torch.cat([getattr(batch.readout, field) for batch in batches], 1)
        torch.testing.assert_close(getattr(joined.readout, field), expected)
    assert joined.exit_readout.nll is None
    torch.testing.assert_close(joined.exit_readout.max_prob, torch.cat([b.exit_readout.max_prob for b in batches], 1))
    assert joined.sampled.tolist() == [0, 2, 4, 5, 8]
    torch.testing.assert_close(joined.sampled_features, torch.cat([b.sampled_features for b in batches], 1))
    assert joined.nbytes == sum(batch.nbytes for batch in batches)
    # a batch without a subsample joins one with it as all of its rows
    mixed = LayerOutputs.cat([layer_batch(2, 3), layer_batch(2, 4, [1])])
    assert mixed.sampled.tolist() == [0, 1, 3]
    assert LayerOutputs.cat(batches[:1]) is batches[0]


def test_the_held_batches_stay_bounded_and_are_fed_in_groups(monkeypatch):
    spec = LayerSpec([1, 2], 2, 4, 5)
    analysis = LayerwiseAnalysis()
    analysis.configure_analyses(None, spec)  # no trainer: no datamodule to read
    state = LoaderState.build(analysis.analyses, spec)
    targets = torch.randint(0, 5, (6,))
    outputs = LayerOutputs(torch.randn(2, 6, 4), readout_from_logits(torch.randn(2, 6, 5), targets), targets)
    one_batch = outputs.select(torch.tensor([0, 1]), None, 1)[0].nbytes
    monkeypatch.setattr(_loader, "GROUP_BYTES", 3 * one_batch)  # a group of three batches
    fed = []
    for _ in range(7):
        state.collect(outputs, torch.tensor([0, 1]), 1, False)
        assert state.held_bytes < _loader.GROUP_BYTES and len(state.held) < _loader.GROUP_BATCHES
        fed.append(int(state.count.count))
    # batches 1-3 are joined at the third and fed at the sixth (after their non-finite check); 7 at the end
    assert fed == [0, 0, 0, 0, 0, 18, 18]
    state.feed_pending()
    assert int(state.count.count) == 42 and not state.held and state.pending is None

    monkeypatch.setattr(_loader, "GROUP_BATCHES", 1)  # a batch past either bound is checked at once
    state.reset()
    state.collect(outputs, torch.tensor([0, 1]), 1, False)
    assert not state.held and state.pending is not None
