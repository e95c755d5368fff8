"""FSDP2 against DDP: aligned-loss training step time, model-state memory per process, and the analysis overhead.

A GPT-2-shaped causal LM (random weights; ``--layers 24 --dim 1024 --heads 16`` is GPT-2 medium) is trained with the
aligned loss (every layer through the shared head, chunked) for ``--steps`` optimizer steps on random tokens, by 2
processes, once under DDP and once under FSDP2 (Lightning's ``ModelParallelStrategy``, ``fully_shard`` per block).
Measured per process: the median step time after one warm-up step; the bytes of parameters, gradients and AdamW
states each process holds after the last step (``DTensor.to_local`` under FSDP2: the shards); on a GPU also
``torch.cuda.max_memory_allocated``. Then one validation pass of ``--val_batches`` batches with and without
``LayerwiseAnalysis`` (minibatch CKA: the exact state would be (L·d)² float64) under FSDP2: the analysis overhead.

Processes are forked with torchrun's environment (as in ``tests/callbacks/test_fsdp.py``): gloo on the CPU, NCCL on GPUs
(one process per GPU, ``--procs`` of them).

    python benchmarks/fsdp.py                                   # CPU, 2 processes, a 6 x 256 model
    python benchmarks/fsdp.py --device cuda --procs 2 --layers 24 --dim 1024 --heads 16 --tokens 512
"""

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from lightning.pytorch import Callback, Trainer
from torch.utils.data import DataLoader, Dataset


class RandomTokens(Dataset):
    def __init__(self, count: int, tokens: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (count, tokens), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "attention_mask": torch.ones_like(self.ids[index])}


class StepTimer(Callback):
    def __init__(self, device: str) -> None:
        self.device, self.times, self.val_time = device, [], 0.0

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._sync()
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._sync()
        self.times.append(time.perf_counter() - self._start)

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._sync()
        self._val_start = time.perf_counter()

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._sync()
        self.val_time = time.perf_counter() - self._val_start


def state_bytes(module, optimizer) -> int:
    """Bytes of parameters, gradients and optimizer states this process holds (local shards under FSDP2)."""

    def local(tensor) -> int:
        tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        return tensor.numel() * tensor.element_size()

    total = 0
    for parameter in module.parameters():
        total += local(parameter) + (local(parameter.grad) if parameter.grad is not None else 0)
    for state in optimizer.state.values():
        total += sum(local(value) for value in state.values() if torch.is_tensor(value) and value.ndim > 0)
    return total


def run(args, strategy_name: str, analysis: bool, out: Path, rank: int) -> None:
    from lightning.pytorch.strategies import ModelParallelStrategy

    from layerwise.callbacks import LayerSimilarityMonitor, LayerwiseAnalysis
    from layerwise.features import HFCausalLM
    from layerwise.lightning_modules import Aligned

    torch.manual_seed(0)
    overrides = dict(
        n_layer=args.layers, n_embd=args.dim, n_head=args.heads, vocab_size=args.vocab, n_positions=args.tokens
    )
    model = Aligned(HFCausalLM(model_type="gpt2", config_overrides=overrides), chunk_size=1024)
    if strategy_name == "fsdp":
        strategy = ModelParallelStrategy(data_parallel_size=args.procs, tensor_parallel_size=1)
    else:
        strategy = "ddp"
    timer = StepTimer(args.device)
    callbacks = [timer] + (
        [
            LayerwiseAnalysis(
                similarity=LayerSimilarityMonitor(cka="minibatch"),
                neural_collapse=False,
                log_figures=False,
                print_table=False,
            )
        ]
        if analysis
        else []
    )
    trainer = Trainer(
        accelerator="gpu" if args.device == "cuda" else "cpu",
        devices=args.procs,
        strategy=strategy,
        precision="bf16-mixed" if args.device == "cuda" else "32-true",
        max_steps=args.steps,
        limit_val_batches=args.val_batches,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        default_root_dir=str(out),
        val_check_interval=args.steps,
        check_val_every_n_epoch=None,
    )
    data = DataLoader(
        RandomTokens(args.procs * args.steps * args.batch, args.tokens, args.vocab), batch_size=args.batch
    )
    val = DataLoader(
        RandomTokens(args.procs * args.val_batches * args.batch, args.tokens, args.vocab), batch_size=args.batch
    )
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer.fit(model, data, val)
    result = {
        "step_s": statistics.median(timer.times[1:]) if len(timer.times) > 1 else float("nan"),
        "state_mib": state_bytes(model, trainer.optimizers[0]) / 2**20,
        "val_s": timer.val_time,
        "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda" else None,
    }
    (out / f"{strategy_name}_{int(analysis)}_rank{rank}.json").write_text(json.dumps(result))


def worker(rank: int, port: int, args, strategy_name: str, analysis: bool, out: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // args.procs))
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(args.procs),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
    )
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    run(args, strategy_name, analysis, Path(out), rank)


def launch(args, strategy_name: str, analysis: bool, out: Path) -> list[dict]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(
        worker, args=(port, args, strategy_name, analysis, str(out)), nprocs=args.procs, start_method="fork"
    )
    return [
        json.loads((out / f"{strategy_name}_{int(analysis)}_rank{rank}.json").read_text()) for rank in range(args.procs)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--val_batches", type=int, default=4)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for strategy_name, analysis in (("ddp", False), ("fsdp", False), ("fsdp", True)):
            results[(strategy_name, analysis)] = launch(args, strategy_name, analysis, Path(folder))
    shape = f"{args.layers} x {args.dim}, vocab {args.vocab}, {args.procs} x {args.batch} x {args.tokens} tokens"
    print(f"aligned loss, {shape}, {args.device}, median of {args.steps - 1} steps per process:\n")
    print("| strategy | step (s) | params + grads + AdamW per process (MiB) | peak CUDA memory (MiB) |")
    print("|---|---|---|---|")
    for (name, analysis), ranks in results.items():
        if analysis:
            continue
        step = statistics.mean(rank["step_s"] for rank in ranks)
        state = max(rank["state_mib"] for rank in ranks)
        peak = "-" if ranks[0]["peak_mib"] is None else f"{max(rank['peak_mib'] for rank in ranks):.0f}"
        print(f"| {name} | {step:.3f} | {state:.1f} | {peak} |")
    plain, analysed = results[("fsdp", False)], results[("fsdp", True)]
    ratio = statistics.mean(rank["step_s"] for rank in results[("fsdp", False)]) / statistics.mean(
        rank["step_s"] for rank in results[("ddp", False)]
    )
    print(f"\nFSDP2 / DDP step time: {ratio:.2f}")
    without = statistics.mean(rank["val_s"] for rank in plain)
    with_analysis = statistics.mean(rank["val_s"] for rank in analysed)
    print(
        f"FSDP2 validation of {args.val_batches} batches per process: {without:.2f} s without the analysis, "
        f"{with_analysis:.2f} s with LayerwiseAnalysis ({with_analysis / without:.2f}x)"
    )


if __name__ == "__main__":
    main()
