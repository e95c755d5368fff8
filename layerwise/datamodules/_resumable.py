"""A training DataLoader that a checkpoint can stop and resume mid-epoch: the same order, from the next batch.

Lightning saves the state of a training dataloader that has ``state_dict``/``load_state_dict`` into the fit loop of
every checkpoint (global rank zero's) and hands it back to every rank on resume, before the first batch. What is
saved: the epoch being iterated, the batches it has yielded, and the seed its shuffled order was drawn with.

- One process: :class:`ReplayableRandomSampler` draws each epoch's seed from torch's global generator exactly as
  ``RandomSampler`` does (the same order, the same draws), and records it; a resume mid-epoch draws nothing and
  replays the recorded order. The global generator itself is restored by the preemption callback
  (:mod:`layerwise.cli.preemption`), so an epoch begun after the resume draws what the uninterrupted run drew.
- DDP and FSDP: Lightning replaces the sampler (a ``RandomSampler`` to it) by its ``DistributedSampler``, whose order
  is a function of its seed and epoch; only the batches yielded are needed then, the same on every rank.

A resumed iteration skips the batches already trained on without loading them (the index sampler is cut, not the
data). Not restored: random state inside DataLoader worker processes (augmentations drawn in workers), which
restart from a new base seed when a fit resumes mid-epoch. The shipped datamodules draw no randomness in workers.
"""

import itertools
from collections.abc import Iterator
from typing import Any, Optional

import torch
from torch.utils.data import DataLoader, RandomSampler


class ReplayableRandomSampler(RandomSampler):
    """``RandomSampler`` (without replacement) whose epoch order can be replayed: the same draws, recorded.

    Each ``__iter__`` draws a seed from torch's global generator (as ``RandomSampler`` does without a ``generator``)
    and permutes with it, so the order equals ``RandomSampler``'s; :attr:`seed` keeps it, and :meth:`replay` makes
    the next ``__iter__`` use a given seed instead of drawing one. Lightning calls :meth:`set_epoch` every epoch.
    """

    def __init__(self, data_source: Any) -> None:
        super().__init__(data_source)
        self.epoch = 0
        self.seed: Optional[int] = None  # the seed of the order being (or last) iterated
        self._replay: Optional[int] = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def replay(self, seed: int) -> None:
        """The next ``__iter__`` permutes with ``seed`` and draws nothing from the global generator."""
        self._replay = seed

    def __iter__(self) -> Iterator[int]:
        if self._replay is not None:
            seed, self._replay = self._replay, None
        else:
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
        self.seed = seed
        size = len(self.data_source)
        yield from torch.randperm(size, generator=torch.Generator().manual_seed(seed)).tolist()


class _Skipping:
    """An index sampler whose first iteration leaves out its first ``skip`` items (the batches already trained on)."""

    def __init__(self, sampler: Any, skip: int) -> None:
        self.sampler, self.skip = sampler, skip

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip = self.skip, 0  # once: persistent workers iterate this object again every epoch
        return itertools.islice(iter(self.sampler), skip, None)

    def __len__(self) -> int:
        return len(self.sampler)


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` with ``state_dict``/``load_state_dict``: Lightning saves and restores its epoch position.

    The iterator is made lazily, at the first batch, after Lightning has set the sampler's epoch. After
    :meth:`load_state_dict`, the first iteration of the saved epoch replays the saved order (its seed, for a
    :class:`ReplayableRandomSampler`) from the batch after the last one yielded; an epoch begun afresh is untouched.
    Built like a ``DataLoader`` (Lightning rebuilds it with its distributed sampler under DDP).
    """

    _yielded = 0
    _epoch: Optional[int] = None
    _seed: Optional[int] = None
    _resume: Optional[dict[str, Any]] = None
    _skipping = 0

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "batches", "seed"}`` of the iteration under way (or last finished)."""
        return {"epoch": self._epoch, "batches": self._yielded, "seed": self._seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = dict(state)
        sampler = self.sampler
        if state.get("epoch") is not None and callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(state["epoch"])  # type: ignore[attr-defined]  # checked just above  # a worker prefetching before Lightning sets it sees the right epoch

    @property
    def _index_sampler(self) -> Any:
        sampler = super()._index_sampler
        return _Skipping(sampler, self._skipping) if self._skipping else sampler

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return self._batches()

    def _batches(self) -> Iterator[Any]:
        resume, self._resume = self._resume, None
        epoch = getattr(self.sampler, "epoch", None)
        skip = 0
        if resume is not None and resume.get("epoch") == epoch and resume.get("batches"):
            skip = int(resume["batches"])
            if resume.get("seed") is not None and isinstance(self.sampler, ReplayableRandomSampler):
                self.sampler.replay(int(resume["seed"]))
        self._epoch, self._yielded = epoch, skip
        generator_state = torch.get_rng_state() if skip else None
        self._skipping = skip
        try:
            iterator = super().__iter__()  # draws the workers' base seed from the global generator
        finally:
            self._skipping = 0
        if generator_state is not None:  # the uninterrupted run drew it at the epoch's start, not here
            torch.set_rng_state(generator_state)
        for batch in iterator:
            # before handing the batch on, which draws the sampler's seed at the first batch
            self._seed = getattr(self.sampler, "seed", None)
            self._yielded += 1
            yield batch


def training_loader(dataset: Any, shuffle: bool = True, **kwargs: Any) -> DataLoader:
    """A training ``DataLoader`` a checkpoint can resume mid-epoch: shuffled by a :class:`ReplayableRandomSampler`."""
    sampler = ReplayableRandomSampler(dataset) if shuffle else None
    return ResumableDataLoader(dataset, sampler=sampler, **kwargs)
