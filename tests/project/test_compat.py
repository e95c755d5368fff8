"""layerwise/_compat.py: every private API of a dependency that layerwise uses, checked where it lives."""

import subprocess
from pathlib import Path

import lightning
import torch
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DistributedSampler

from layerwise import _compat
from layerwise.engines.sampling import real_samples_on_rank
from layerwise.metrics import LayerCKA

ROOT = Path(__file__).resolve().parents[2]
PRIVATE = (
    r"\._(reductions|computed|is_synced|dtype_convert|pos_embed|from_config)\b"
    r"|_given_"
    r"hyperparameters|overrides\.distributed"  # split so that this file does not match itself
    r"|def _app" + r"ly\b"  # overriding torch/torchmetrics' Module._apply
    r"|\._time" + r"out\b|_get_default_" + r"store"  # a strategy's process group timeout, the group's store
    r"|_signal_" + r"connector|_should_check_" + r"val_fx"  # Lightning's SIGTERM flag, its mid-epoch validation
    r"|_save_distributed_" + r"checkpoint"  # whether ModelParallelStrategy saves sharded folders
)


def test_private_uses_live_only_in_compat():
    found = subprocess.run(["git", "grep", "-nE", PRIVATE], cwd=ROOT, capture_output=True, text=True).stdout
    files = {line.split(":")[0] for line in found.splitlines()}
    assert files == {"layerwise/_compat.py"}, found


def test_lightning_cli_flag_is_seen_during_cli_instantiation_only():
    from lightning.pytorch.core.mixins import hparams_mixin

    name = "_given_" + "hyperparameters"
    assert hasattr(hparams_mixin, name), (
        f"Lightning {lightning.__version__} moved `{name}` (checked on {_compat.CHECKED_LIGHTNING}): "
        "update layerwise/_compat.py"
    )
    assert _compat.built_by_lightning_cli() is False
    seen = []

    class Probe(lightning.LightningModule):
        def __init__(self, width: int = 2) -> None:
            super().__init__()
            seen.append(_compat.built_by_lightning_cli())

    LightningCLI(Probe, run=False, args=["--trainer.logger=false"])
    assert seen == [True]
    Probe()
    assert seen == [True, False]


class _Padded(DistributedSampler):
    def __init__(self, size: int, rank: int, world: int, **kwargs) -> None:
        super().__init__(list(range(size)), num_replicas=world, rank=rank, shuffle=False, **kwargs)


def test_real_samples_use_the_public_sampler_attributes():
    loader = torch.utils.data.DataLoader(list(range(5)), sampler=_Padded(5, 1, 2))
    assert real_samples_on_rank(loader) == 2  # indices 1, 3 are real; the third is padding
    unpadded = _Padded(5, 1, 2)
    unpadded.total_size, unpadded.num_samples = 5, 2  # what Lightning's unrepeated sampler does
    assert real_samples_on_rank(torch.utils.data.DataLoader(list(range(5)), sampler=unpadded)) is None
    assert (
        real_samples_on_rank(torch.utils.data.DataLoader(list(range(5)), sampler=_Padded(5, 1, 2, drop_last=True)))
        is None
    )


def tensor_elements_held(obj) -> int:
    """Elements of every distinct tensor reachable from ``vars(obj)`` through dicts, lists and tuples."""
    seen, stack, total = set(), list(vars(obj).values()), 0
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            if id(value) not in seen:
                seen.add(id(value))
                total += value.numel()
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return total


def test_cka_state_is_held_once_and_reset_restores_zeros():
    layers, dim = 4, 16
    metric = LayerCKA(layers, dim)
    state = (layers * dim) ** 2
    assert metric.cross.shape == (layers * dim, layers * dim)
    assert tensor_elements_held(metric) < 1.1 * state, "the (L*d)^2 state must be held once, not twice"
    metric.update(torch.randn(layers, 8, dim, dtype=torch.float64))
    assert metric.cross.abs().sum() > 0
    metric.reset()
    assert metric.cross.shape == (layers * dim, layers * dim) and metric.cross.dtype == torch.float64
    assert metric.cross.abs().sum() == 0 and tensor_elements_held(metric) < 1.1 * state


def test_metric_apply_is_where_float64_states_meet_a_parent_cast():
    import inspect

    import torchmetrics

    parameters = list(inspect.signature(torchmetrics.Metric._apply).parameters)
    assert parameters == ["self", "fn", "exclude_state"], (
        f"torchmetrics {torchmetrics.__version__} changed Metric._apply (checked on {_compat.CHECKED_TORCHMETRICS}): "
        "update layerwise/_compat.py::Float64StatesOnCast"
    )
    metric = LayerCKA(num_layers=2, dim=3)
    parent = torch.nn.ModuleList([metric]).to(torch.bfloat16)  # Lightning's "bf16-true" casts so
    assert all(getattr(metric, name).dtype == torch.float64 for name in metric.sum_state_names)
    metric.set_dtype(torch.float32)  # the metric's own public cast still casts
    assert all(getattr(metric, name).dtype == torch.float32 for name in metric.sum_state_names)
    assert isinstance(parent[0], _compat.Float64StatesOnCast)


def test_already_reduced_silences_lightnings_sync_advice_for_those_keys_only(monkeypatch, recwarn):
    """The advice's text is Lightning's: a key marked already reduced is not advised, another one still is."""
    from lightning.pytorch.trainer.connectors.logger_connector import result

    monkeypatch.setattr(result, "_distributed_is_initialized", lambda: True)
    monkeypatch.setattr(result, "warning_cache", type(result.warning_cache)())
    collection = result._ResultCollection(training=False)
    for key in ("val/marked/layer_01", "val/user_key"):
        collection.log("on_validation_epoch_end", key, torch.tensor(1.0), on_step=False, on_epoch=True)
    _compat.already_reduced(["val/marked/layer_01"])
    collection.metrics(on_step=False)
    advised = [str(w.message) for w in recwarn if "sync_dist=True" in str(w.message)]
    assert len(advised) == 1 and "'val/user_key'" in advised[0], advised


def test_the_process_group_timeout_is_read_from_the_strategies_that_take_one():
    from datetime import timedelta

    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy

    assert _compat.process_group_timeout(DDPStrategy(timeout=timedelta(minutes=2))) == "0:02:00"
    assert _compat.process_group_timeout(DDPStrategy()) == "0:30:00"  # Lightning's default, as the docs say
    assert _compat.process_group_timeout(ModelParallelStrategy(timeout=timedelta(seconds=90))) == "0:01:30"
    assert _compat.process_group_timeout(FSDPStrategy(timeout=timedelta(seconds=5))) == "0:00:05"
    assert _compat.process_group_timeout(object()) is None


def test_the_default_store_is_the_process_groups_own(tmp_path):
    import torch.distributed as dist
    from helpers import free_port

    assert _compat.default_store() is None  # no process group
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        store = _compat.default_store()
        store.set("layerwise/probe", "seen")
        assert store.get("layerwise/probe") == b"seen" and store.check(["layerwise/probe"])
    finally:
        dist.destroy_process_group()


def test_lightning_still_gives_the_sampler_advice_that_layerwise_replaces():
    import inspect
    import re

    from lightning.pytorch.trainer.connectors import data_connector

    source = inspect.getsource(data_connector._DataConnector._resolve_sampler)
    assert "Using `DistributedSampler` with the dataloaders. During `trainer.{trainer_fn.value}()`" in source, (
        f"Lightning {lightning.__version__} changed its DistributedSampler advice: update _compat.SAMPLER_ADVICE"
    )
    assert "PossibleUserWarning" in source
    for stage in ("validate", "test"):
        said = f"Using `DistributedSampler` with the dataloaders. During `trainer.{stage}()`, it is recommended"
        assert re.match(_compat.SAMPLER_ADVICE, said)
    fit = "Using `DistributedSampler` with the dataloaders. During `trainer.fit()`"
    assert not re.match(_compat.SAMPLER_ADVICE, fit)


def test_the_keys_layerwise_reduced_itself_are_remembered():
    _compat.already_reduced({"val/acc/layer_00": 0.5})
    assert "val/acc/layer_00" in _compat.REDUCED_KEYS


def test_lightnings_sigterm_flag_is_taken_over_and_cleared():
    from lightning.pytorch import Trainer

    trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert not _compat.take_lightning_sigterm(trainer)  # the flag exists and is down
    getattr(trainer, "_signal" + "_connector").received_sigterm = True  # as Lightning's handler sets it
    assert _compat.take_lightning_sigterm(trainer)
    assert not _compat.take_lightning_sigterm(trainer)  # cleared: Lightning's loops will not stop by themselves


def test_lightnings_mid_epoch_validation_decision_is_still_there():
    import inspect

    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    decision = getattr(_TrainingEpochLoop, "_should_check_" + "val_fx")
    assert list(inspect.signature(decision).parameters) == ["self", "data_fetcher"]


def test_a_sharded_saving_model_parallel_strategy_is_recognised_and_its_save_is_still_lightnings():
    """``saves_sharded`` reads ModelParallelStrategy's ``save_distributed_checkpoint``; ``save_sharded`` replaces its
    ``save_checkpoint``, so Lightning's must still write what it replaces: the shards, then ``meta.pt``
    (by torch.save)."""
    import inspect

    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    assert _compat.saves_sharded(ModelParallelStrategy())
    assert not _compat.saves_sharded(ModelParallelStrategy(save_distributed_checkpoint=False))
    assert not _compat.saves_sharded(DDPStrategy())

    class OwnSaving(ModelParallelStrategy):
        def save_checkpoint(self, checkpoint, filepath, storage_options=None) -> None:
            pass

    assert not _compat.saves_sharded(OwnSaving())
    source = inspect.getsource(ModelParallelStrategy.save_checkpoint)
    for step in ('checkpoint.pop("state_dict")', '"optimizer_states"', "_distributed_checkpoint_save(", "torch.save("):
        assert step in source, f"Lightning {lightning.__version__} saves sharded folders otherwise: update save_sharded"
