"""The training loader a checkpoint resumes mid-epoch: RandomSampler's own order and draws, a state that replays the
rest of the epoch from the next batch, and nothing replayed in an epoch begun afresh."""

import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from layerwise.datamodules._resumable import ReplayableRandomSampler, ResumableDataLoader, training_loader

DATA = TensorDataset(torch.arange(23))


def batches(loader) -> list[list[int]]:
    return [batch[0].tolist() for batch in loader]


def test_the_order_and_the_draws_are_random_samplers():
    torch.manual_seed(5)
    expected = list(RandomSampler(DATA))
    after_expected = torch.rand(3)
    torch.manual_seed(5)
    assert list(ReplayableRandomSampler(DATA)) == expected
    assert torch.equal(torch.rand(3), after_expected), "one draw from the global generator, as RandomSampler makes"


def test_a_loader_resumed_mid_epoch_yields_the_rest_of_the_epoch_and_draws_nothing():
    torch.manual_seed(0)
    loader = training_loader(DATA, batch_size=4)
    loader.sampler.set_epoch(3)
    iterator = iter(loader)
    first = [next(iterator)[0].tolist() for _ in range(2)]
    state = loader.state_dict()
    rest = [batch[0].tolist() for batch in iterator]
    assert state["epoch"] == 3 and state["batches"] == 2 and sorted(sum(first + rest, [])) == list(range(23))

    torch.manual_seed(99)  # the resumed process's generator, restored elsewhere: replaying must not draw from it
    before = torch.get_rng_state()
    resumed = training_loader(DATA, batch_size=4)
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(3)  # as Lightning does at the epoch's start
    assert batches(resumed) == rest
    assert torch.equal(torch.get_rng_state(), before)
    assert resumed.state_dict()["batches"] == 6


def test_an_epoch_begun_after_the_saved_one_is_not_replayed():
    torch.manual_seed(1)
    loader = training_loader(DATA, batch_size=4)
    done = batches(loader)  # epoch 0, finished
    state = loader.state_dict()
    after = torch.get_rng_state()
    torch.manual_seed(1)
    reference = training_loader(DATA, batch_size=4)
    assert batches(reference) == done
    expected_next = batches(reference)  # the uninterrupted epoch 1 (set_epoch or not, drawn afresh)

    torch.set_rng_state(after)  # restored random states
    resumed = training_loader(DATA, batch_size=4)
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(1)
    assert batches(resumed) == expected_next


def test_the_skip_applies_to_the_first_iteration_only():
    torch.manual_seed(2)
    loader = ResumableDataLoader(DATA, batch_size=5, sampler=ReplayableRandomSampler(DATA))
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    resumed = ResumableDataLoader(DATA, batch_size=5, sampler=ReplayableRandomSampler(DATA))
    resumed.load_state_dict(state)
    assert len(batches(resumed)) == 4 and len(batches(resumed)) == 5 and len(resumed) == 5


def test_an_unshuffled_loader_is_a_plain_resumable_one():
    loader = training_loader(DATA, shuffle=False, batch_size=10)
    assert isinstance(loader, DataLoader) and batches(loader)[0] == list(range(10))
