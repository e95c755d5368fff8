"""A sharded FSDP2 checkpoint is usable by the rest of the toolkit on one process: export, validate, probes, lens.

Two CPU processes (gloo) fit the tiny ViT under Lightning's ``ModelParallelStrategy`` (FSDP2) and save a checkpoint
as ``layerwise fit`` does (``save_distributed_checkpoint`` on: a folder of shards plus ``meta.pt``). One process then
reads the folder through the one loader (``load_module``), through Lightning's own ``validate(ckpt_path=FOLDER)``,
through ``LinearProbes(checkpoint=FOLDER)`` and ``load_model`` (lens/generate/coupling's ``--checkpoint``), and every
one of them holds the weights the two processes trained (gathered there with ``full_tensor``).
"""

import os
import sys

import pytest
import torch
import torch.distributed as dist
from helpers import DIM, TRAINING_ONLY, fitted_module, free_port, run_forked, train_loader, trainer, val_loader

from layerwise.commands.export import export_truncated
from layerwise.engines.checkpoint import is_sharded_checkpoint, load_model, load_module, save_sharded
from layerwise.lightning_modules import LinearProbes, Standard

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or not dist.is_available(), reason="needs fork and torch.distributed"
)
BACKBONE = dict(num_classes=10, img_size=8, patch_size=2, in_chans=1, embed_dim=DIM, depth=4, num_heads=2)
HYPER_PARAMETERS = {  # what LightningCLI stores for `layerwise fit` (the module's and the backbone's class paths)
    "_instantiator": "lightning.pytorch.cli.instantiate_module",
    "_class_path": "layerwise.lightning_modules.Standard",
    "backbone": {"class_path": "layerwise.features.TimmViT", "init_args": BACKBONE},
}


def worker(rank: int, port: int, root: str) -> None:
    from lightning.pytorch.strategies import ModelParallelStrategy

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank)
    )
    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    job = trainer(root, [], devices=2, strategy=strategy, max_steps=2, limit_val_batches=0)
    model = Standard(fitted_module().backbone, optimizer=lambda params: torch.optim.SGD(params, lr=0.05))
    model.hparams.update(HYPER_PARAMETERS)
    job.fit(model, train_loader(64, batch_size=16))
    assert job.strategy.save_checkpoint.func is save_sharded  # the module's setup made meta.pt's write atomic
    job.save_checkpoint(os.path.join(root, "last.ckpt"))  # what ModelCheckpoint calls
    weights = {name: value.full_tensor() for name, value in model.state_dict().items()}  # a collective
    if rank == 0:
        torch.save(weights, os.path.join(root, "trained.pt"))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp2")
    environment, threads = dict(os.environ), torch.get_num_threads()
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    try:
        run_forked(worker, (free_port(), str(root)), nprocs=2, timeout_s=240)
    finally:
        torch.set_num_threads(threads)
        os.environ.clear()
        os.environ.update(environment)
    return root / "last.ckpt", torch.load(root / "trained.pt")


def assert_trained(module, trained) -> None:
    state = module.state_dict()
    assert set(state) == set(trained)
    for name, value in trained.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=0, msg=name)


def test_fsdp2_writes_a_sharded_folder(sharded):
    folder, trained = sharded
    assert folder.is_dir() and is_sharded_checkpoint(folder) and (folder / "meta.pt").is_file()
    assert not torch.equal(
        trained["backbone.model.blocks.0.mlp.fc1.weight"],
        fitted_module().state_dict()["backbone.model.blocks.0.mlp.fc1.weight"],
    )  # it trained


def test_the_one_loader_and_export_read_the_sharded_folder(sharded, tmp_path):
    folder, trained = sharded
    module = load_module(folder)
    assert type(module) is Standard
    assert_trained(module, trained)
    written = export_truncated(module, 2, tmp_path / "out")
    assert written.checkpoint.is_file()


def test_one_process_validate_reads_the_sharded_folder(sharded, tmp_path):
    folder, trained = sharded
    module = fitted_module()  # other weights: validate must load the trained ones from the folder
    trainer(tmp_path, []).validate(module, val_loader(), ckpt_path=folder, verbose=False)
    assert_trained(module, trained)


def test_probes_and_model_loading_read_the_sharded_folder(sharded):
    folder, trained = sharded
    probes = LinearProbes(num_classes=10, checkpoint=str(folder))
    for name, value in probes.backbone.state_dict().items():
        torch.testing.assert_close(value, trained[f"backbone.{name}"], rtol=0, atol=0, msg=name)
    model = load_model(str(folder), "--checkpoint")
    assert sum(p.numel() for p in model.parameters()) > 0


@TRAINING_ONLY
def test_resuming_fit_from_a_sharded_folder_on_one_process_is_refused_in_one_line(sharded, tmp_path):
    folder, _ = sharded
    job = trainer(tmp_path, [], max_steps=3)
    with pytest.raises(ValueError, match=rf"^`--ckpt_path={folder}` is a sharded \(FSDP2\) checkpoint: resume `fit`"):
        job.fit(fitted_module(), train_loader(64, batch_size=16), ckpt_path=folder)


def test_a_folder_that_is_no_checkpoint_is_named(tmp_path):
    with pytest.raises(ValueError, match="is a folder, neither a checkpoint file nor a sharded checkpoint"):
        load_module(tmp_path)


def test_the_export_command_reads_the_sharded_folder(sharded, tmp_path):
    from layerwise.cli import main

    folder, _ = sharded
    main(["export", "--checkpoint", str(folder), "--depth", "2", "--out", str(tmp_path / "out")])
    assert (tmp_path / "out" / "model_depth_2.pt").is_file()
