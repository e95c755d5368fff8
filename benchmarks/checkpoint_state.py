"""What a resumable checkpoint's extra state costs: every rank's random states and the training data's position.

A quickstart fit (the shipped model and data, no logger) saves the same checkpoint ``--repeats`` times in the middle
of its first epoch (after step 3), with and without that state, in fits alternated twice (the second pair counts):
*with* is ``layerwise fit`` as it runs (the ``Preemption`` callback's random states, the ``ResumableDataLoader``'s
position in the fit loop), *without* the same Trainer with neither (a plain ``DataLoader``, no ``Preemption``). Per
checkpoint: the file's bytes and the median seconds of ``trainer.save_checkpoint`` (dump + write), and the extra
state's own bytes; also the median seconds of the ranks' agreement on a signal, paid at every optimizer step. With
``--processes 2`` the same on two forked gloo processes (the random states are gathered from every rank: one
``all_gather_object``; the agreement is one all-reduce).
Records ``recorded/checkpoint_state.json`` (``checkpoint_state_2_processes`` with ``--processes 2``).

    python benchmarks/checkpoint_state.py [--repeats 21] [--processes 1|2]
"""

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import load_now, record  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


class Saver(Callback):
    """At the end of training step ``at``: save ``repeats`` checkpoints to ``path``, timing each (every rank)."""

    def __init__(self, at: int, repeats: int, path: Path) -> None:
        self.at, self.repeats, self.path = at, repeats, path
        self.seconds: list[float] = []
        self.agree_seconds: list[float] = []
        self.broadcast_seconds: list[float] = [0.0]
        self.size = 0
        self.extra: dict[str, int] = {}

    def on_train_batch_end(self, trainer, *args, **kwargs) -> None:
        if trainer.global_step != self.at:
            return
        from layerwise.cli.preemption import agreed_signal

        for _ in range(self.repeats):
            start = time.perf_counter()
            trainer.save_checkpoint(self.path, weights_only=False)
            self.seconds.append(time.perf_counter() - start)
            start = time.perf_counter()
            agreed_signal(trainer, 0)  # what deciding together costs at every optimizer step
            self.agree_seconds.append(time.perf_counter() - start)
            if trainer.world_size > 1:  # beside it: Lightning's own broadcast of rank 0's SIGTERM flag, every step
                start = time.perf_counter()
                flag = torch.tensor([0], device=trainer.strategy.root_device)
                torch.distributed.broadcast(flag, src=0)
                flag.item()
                self.broadcast_seconds.append(time.perf_counter() - start)
        self.size = self.path.stat().st_size if trainer.is_global_zero else 0
        self.extra = extra_bytes(trainer)


def fit(with_state: bool, world_size: int, repeats: int, root: Path) -> Saver:
    """A quickstart model trained 4 steps; at step 3, ``repeats`` checkpoints with or without the resumable state."""
    import lightning.pytorch as pl
    import yaml
    from jsonargparse import ArgumentParser
    from torch.utils.data import DataLoader

    from layerwise.cli.preemption import Preemption
    from layerwise.datamodules import DigitsDataModule

    config = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())
    parser = ArgumentParser()
    parser.add_argument("--model", type=pl.LightningModule)
    model = parser.instantiate_classes(parser.parse_object({"model": config["model"]})).model
    datamodule = DigitsDataModule(batch_size=64)
    if not with_state:  # a plain DataLoader: no position in the checkpoint
        datamodule.setup()
        datamodule.train_dataloader = lambda: DataLoader(datamodule.train_set, batch_size=64, shuffle=True)
    saver = Saver(3, repeats, root / f"{with_state}.ckpt")
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world_size,
        strategy="ddp" if world_size > 1 else "auto",
        max_steps=4,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[saver, *([Preemption([])] if with_state else [])],
        default_root_dir=root,
    )
    trainer.fit(model, datamodule)
    return saver


def extra_bytes(trainer) -> dict[str, int]:
    """Bytes of the random states and of the training loader's state, each serialised alone."""
    checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
    sizes = {}
    for name, part in (
        ("random_states", checkpoint.get("layerwise_random_states")),
        ("data_position", checkpoint["loops"]["fit_loop"]["state_dict"].get("combined_loader")),
    ):
        buffer = io.BytesIO()
        torch.save(part, buffer)
        sizes[name] = len(buffer.getvalue()) if part is not None else 0
    return sizes


def run(rank: int, world_size: int, repeats: int, port: int, out: Path) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    if world_size > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size))
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), NODE_RANK="0")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        savers = {}
        for with_state in (False, True, False, True):  # alternated, twice; the second pair is measured
            savers[with_state] = fit(with_state, world_size, repeats, root)
    if rank == 0:
        with_, without = savers[True], savers[False]
        values = {
            "processes": world_size,
            "repeats": repeats,
            "bytes_with": with_.size,
            "bytes_without": without.size,
            "bytes_random_states": with_.extra["random_states"],
            "bytes_data_position": with_.extra["data_position"],
            "seconds_with": round(statistics.median(with_.seconds), 5),
            "seconds_without": round(statistics.median(without.seconds), 5),
            "agree_seconds_per_step": round(statistics.median(with_.agree_seconds), 6),
            "lightning_broadcast_seconds_per_step": round(statistics.median(with_.broadcast_seconds), 6),
        }
        values["bytes_added"] = values["bytes_with"] - values["bytes_without"]
        values["seconds_added"] = round(values["seconds_with"] - values["seconds_without"], 5)
        out.write_text(json.dumps(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--processes", type=int, default=1, choices=(1, 2))
    args = parser.parse_args()
    load = load_now()
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "values"
        if args.processes == 1:
            run(0, 1, args.repeats, 0, out)
        else:
            import socket

            import torch.multiprocessing as mp

            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            mp.start_processes(run, args=(2, args.repeats, port, out), nprocs=2, start_method="fork")
        values = json.loads(out.read_text())
    for key, value in values.items():
        print(f"{key:>22}: {value}")
    name = "checkpoint_state" if args.processes == 1 else "checkpoint_state_2_processes"
    record(name, values, load)


if __name__ == "__main__":
    main()
