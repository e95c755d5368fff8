"""The tuned-lens fit under FSDP2 (Lightning's ``ModelParallelStrategy``, ``fully_shard``) on two CPU processes (gloo).

Two forked processes, started the way torchrun starts them (as tests/callbacks/test_fsdp.py does), fit a tuned lens
on a tiny random GPT-2 (2 blocks) with the frozen backbone and every translator sharded; one process fits the same
lens on the same global batches. The translators each writes (``tuned_lens.safetensors``, gathered from their shards
with ``full_tensor``) are the same within float tolerance, and the file is read without pickle.
"""

import os
import sys

import pytest
import torch
import torch.distributed as dist
from helpers import FROZEN_IN_EVAL, TRAINING_ONLY, free_port, run_forked
from test_tuned_lens import InOrder, quiet_trainer
from tiny_models import DECODERS

from layerwise.engines.lens import TUNED_LENS_FILE, load_translators
from layerwise.features import HFCausalLM
from layerwise.lightning_modules import TunedLens

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux" or not dist.is_available(), reason="needs fork and torch.distributed"),
    pytest.mark.slow,  # two processes, each importing and sharding: over 20 s on a loaded 2-core box
]
STEPS, GLOBAL_BATCH = 4, 6


def lens_module() -> TunedLens:
    """A tuned lens on a float64 random GPT-2 of 2 blocks, the same weights in every process (seeded)."""
    torch.manual_seed(0)
    backbone = HFCausalLM(model_type="gpt2", config_overrides={**DECODERS["gpt2"], "n_layer": 2})
    assert backbone.num_layers == 2
    return TunedLens(backbone=backbone.double().eval(), lr=0.5).double()


def worker(rank: int, port: int, root: str) -> None:
    from lightning.pytorch.strategies import ModelParallelStrategy

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank)
    )
    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    lens = lens_module()
    trainer = quiet_trainer(STEPS, default_root_dir=root, devices=2, strategy=strategy, use_distributed_sampler=False)
    trainer.fit(lens, datamodule=InOrder(batch_size=GLOBAL_BATCH // 2))
    sharded = lens.translators.translators[0].weight
    assert type(sharded).__name__ == "DTensor", type(sharded)  # the translators really were sharded


@FROZEN_IN_EVAL
@TRAINING_ONLY
@pytest.mark.filterwarnings("ignore:.*does not have many workers")
def test_fsdp2_trains_the_same_translators_as_one_process_for_the_same_global_batch(tmp_path):
    environment, threads = dict(os.environ), torch.get_num_threads()
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    try:
        run_forked(worker, (free_port(), str(tmp_path / "fsdp2")), nprocs=2, timeout_s=300)
    finally:
        torch.set_num_threads(threads)
        os.environ.clear()
        os.environ.update(environment)
    one = lens_module()
    quiet_trainer(STEPS, default_root_dir=tmp_path / "one", use_distributed_sampler=False).fit(
        one, datamodule=InOrder(batch_size=GLOBAL_BATCH)
    )
    single = load_translators(tmp_path / "one" / TUNED_LENS_FILE)
    sharded = load_translators(tmp_path / "fsdp2" / TUNED_LENS_FILE)  # safetensors: no pickle
    assert (sharded.num_layers, sharded.d_model) == (2, DECODERS["gpt2"]["n_embd"])
    assert min(float(p.detach().abs().max()) for p in single.parameters()) > 1e-5  # they left their start
    for (name, expected), (_, value) in zip(single.state_dict().items(), sharded.state_dict().items()):
        torch.testing.assert_close(value, expected, rtol=1e-9, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")
