"""The CLI, every shipped config, the quickstart, resuming, and bad input failing before any work."""

import json
import os
import re
import subprocess
import sys
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from helpers import FROZEN_IN_EVAL, TRAINING_ONLY, RecordingAlternating, free_port, read_summary, summary_file
from tiny_models import tiny_overrides
from torch.utils.data import DataLoader, TensorDataset

from layerwise.cli import LayerwiseCLI, main
from layerwise.features import TimmViT
from layerwise.lightning_modules import AlternatingAligned, WarmupCosineLR

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
QUICKSTART = str(CONFIGS / "quickstart.yaml")
TRAINER_CONFIGS = sorted((CONFIGS / "trainer").glob("*.yaml"))
EXPERIMENT_CONFIGS = sorted(p for p in CONFIGS.rglob("*.yaml") if "TimmViT" in p.read_text())
LANGUAGE_CONFIGS = sorted(p for p in CONFIGS.rglob("*.yaml") if "layerwise.features.HF" in p.read_text())
SMALL = dict(num_hidden_layers=2, hidden_size=16, num_attention_heads=2, intermediate_size=32)
TINY_HF = {  # the --config_overrides of a tiny offline stand-in, with the Hugging Face positions it was written with
    "bert": tiny_overrides("bert", **SMALL, max_position_embeddings=512),
    "gpt2": tiny_overrides("gpt2", n_layer=2, n_embd=16, n_head=2, n_positions=1024, bos_token_id=0, eos_token_id=0),
    "llama": tiny_overrides(
        "llama", **SMALL, num_key_value_heads=1, max_position_embeddings=2048, vocab_size=300, bos_token_id=0,
        eos_token_id=0,
    ),
}  # fmt: skip
TINY = [
    "--model.init_args.backbone.init_args.embed_dim=16",
    "--model.init_args.backbone.init_args.depth=2",
    "--model.init_args.backbone.init_args.num_heads=2",
    "--data.init_args.num_workers=0",
]
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def fake_data_root(tmp_path: Path, config: Path) -> list[str]:
    """A local folder in the layout the config's datamodule expects (instantiation checks the layout only)."""
    text = config.read_text()
    if "CIFAR10DataModule" in text:
        folder = tmp_path / "cifar-10-batches-py"
        names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
    elif "ImageNetDataModule" in text:
        folder = tmp_path / "imagenet"
        for split in ("train", "val"):
            (folder / split / "n01440764").mkdir(parents=True)
        return [f"--data.init_args.root={folder}", "--data.init_args.img_size=32"]
    else:
        return []
    folder.mkdir()
    for name in names:
        (folder / name).touch()
    return [f"--data.init_args.root={folder}"]


@pytest.mark.parametrize("config", EXPERIMENT_CONFIGS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_experiment_config_parses_and_instantiates(config, tmp_path):
    size = ["--model.init_args.backbone.init_args.img_size=32"] if "imagenet" in str(config) else []
    cli = LayerwiseCLI(args=["--config", str(config), *TINY, *size, *fake_data_root(tmp_path, config)], run=False)
    assert cli.model.backbone.num_layers == 2
    assert isinstance(cli.trainer, pl.Trainer)
    assert any(type(c).__name__ == "LayerwiseAnalysis" for c in cli.trainer.callbacks)
    expected_lr = 0.1 if "paper" in config.parts else None
    if expected_lr is not None:
        assert cli.config.model.init_args.optimizer.init_args.lr == expected_lr
        milestones = cli.config.model.init_args.lr_scheduler.init_args.milestones
        assert list(milestones) == [100, 150] and cli.config.trainer.max_epochs == 200


@pytest.mark.parametrize("config", LANGUAGE_CONFIGS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_language_config_parses_and_instantiates(config, tmp_path):
    # Hub weights are swapped for a tiny offline model of the same family; everything else is parsed as written.
    text = config.read_text()
    args = ["--config", str(config), "--trainer.accelerator=cpu", "--trainer.precision=32-true"]
    family = "bert" if "bert-base" in text else "gpt2" if "model_name_or_path: gpt2" in text else "llama"
    if "model_name_or_path" in text:
        override = tmp_path / "tiny.yaml"
        override.write_text(
            "model:\n  init_args:\n    backbone:\n      init_args:\n        model_name_or_path: null\n"
            f"        model_type: {family}\n        config_overrides: {json.dumps(TINY_HF[family])}\n"
        )
        args += ["--config", str(override)]
    if "../shared/data" in text and not (ROOT.parent / "shared" / "data").is_dir():
        # the demonstrations read the real local data; elsewhere, files in the same formats stand in for it
        corpus = tmp_path / "input.txt"
        corpus.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 200)
        (tmp_path / "sst2").mkdir()
        for split in ("train", "validation"):
            rows = "".join(f"a {'good' if i % 2 else 'bad'} film {i}\t{i % 2}\n" for i in range(40))
            (tmp_path / "sst2" / f"{split}.tsv").write_text("sentence\tlabel\n" + rows)
        data = ["--data.init_args.train_files=[" + str(corpus) + "]"] if "Shakespeare" in text else []
        args += data or [f"--data.init_args.data_dir={tmp_path / 'sst2'}"]
    if "/path/to/" in text:  # the LLaMA analysis reads a local text file
        corpus = tmp_path / "text.txt"
        corpus.write_text("a few words of text\n" * 50)
        args += [f"--data.init_args.train_files=[{corpus}]", f"--data.init_args.val_files=[{corpus}]"]
        args += ["--data.init_args.tokenizer=byte"]
    if "sampled_exits:" in text:  # the tiny stand-in has 2 layers: nothing to sample
        args += ["--model.init_args.sampled_exits=null"]
    cli = LayerwiseCLI(args=args, run=False)
    assert isinstance(cli.trainer, pl.Trainer)
    assert any(type(c).__name__ == "LayerwiseAnalysis" for c in cli.trainer.callbacks)
    model, data, trainer_config = cli.config.model.init_args, cli.config.data.init_args, cli.config.trainer
    if "activation_checkpointing: true" in text:
        hf_model = cli.model.backbone.model
        renamed = hasattr(hf_model, "is_activation_checkpointing")  # `is_gradient_checkpointing` in older transformers
        assert hf_model.is_activation_checkpointing if renamed else hf_model.is_gradient_checkpointing
    if config.parent.name == "glue":  # the paper's BERT runs
        assert model.optimizer.init_args.lr == 2e-5 and trainer_config.max_epochs == 3
        assert (data.max_length, data.batch_size, data.task) == (256, 32, config.stem.split("_")[2])
        assert cli.model.backbone.num_classes == (3 if data.task == "mnli" else 2)
    if config.parent.name == "wikitext":  # the paper's GPT-2 runs: 10 % warm-up, effective batch 128
        schedule = model.lr_scheduler.init_args
        assert model.optimizer.init_args.lr == 2e-5 and data.block_size == 256
        assert data.batch_size * trainer_config.accumulate_grad_batches == 128
        assert schedule.warmup_epochs * 10 == schedule.max_epochs == trainer_config.max_steps
        assert (data.dataset, data.dataset_config) == ("Salesforce/wikitext", "wikitext-103-raw-v1")


@pytest.mark.parametrize("config", TRAINER_CONFIGS, ids=lambda p: p.name)
def test_every_trainer_config_parses_and_instantiates(config, tmp_path):
    # GPU configs are parsed as written and instantiated with the accelerator swapped for the CPU this test has.
    cpu = ["--trainer.accelerator=cpu", "--trainer.precision=32-true"] if "gpu" in config.name else []
    devices = ["--trainer.devices=2"] if "ddp_gpu" in config.name or "fsdp" in config.name else []
    if "fsdp" in config.name:
        devices.append("--trainer.strategy.init_args.data_parallel_size=2")
    cli = LayerwiseCLI(args=["--config", QUICKSTART, "--config", str(config), *cpu, *devices], run=False)
    parsed = cli.config.trainer
    written = config.read_text()
    assert f"accelerator: {parsed.accelerator}" in written or cpu
    assert isinstance(cli.trainer, pl.Trainer)
    if "ddp" in config.name or "fsdp" in config.name:
        assert cli.trainer.num_devices == 2
    if "fsdp" in config.name:
        assert type(cli.trainer.strategy).__name__ == "ModelParallelStrategy"


def test_last_checkpoint_is_the_final_state_not_the_last_best(tmp_path):
    """With lr = 0 val/acc never improves after epoch 0: a monitored save_last would leave last.ckpt at epoch 0."""
    cli = LayerwiseCLI(
        args=[
            "fit",
            "--config",
            QUICKSTART,
            *TINY,
            "--trainer.max_epochs=3",
            "--trainer.limit_train_batches=2",
            "--trainer.limit_val_batches=1",
            "--model.init_args.optimizer.init_args.lr=0.0",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            *QUIET,
        ]
    )
    checkpoints = tmp_path / "quickstart" / "version_0" / "checkpoints"
    last = torch.load(checkpoints / "last.ckpt", weights_only=True, map_location="cpu")
    assert last["epoch"] == 2 and last["global_step"] == cli.trainer.global_step == 6
    best = [path for path in checkpoints.glob("*.ckpt") if path.name != "last.ckpt"]
    assert len(best) == 1 and "epoch=0" in best[0].name  # the monitored best stays where it was
    assert cli.trainer.checkpoint_callback.monitor == "val/acc"  # `--ckpt_path best` still means the best


def test_every_config_keeps_last_ckpt_as_the_final_state():
    for config in sorted(CONFIGS.rglob("*.yaml")):
        callbacks = (yaml.safe_load(config.read_text()).get("trainer") or {}).get("callbacks") or []
        checkpoints = [c.get("init_args") for c in callbacks if c["class_path"].endswith("ModelCheckpoint")]
        assert all(isinstance(c, dict) for c in checkpoints), config
        if not checkpoints:
            continue
        assert not any(c.get("save_last") and c.get("monitor") for c in checkpoints), config
        assert any(c.get("filename") == "last" and not c.get("monitor") for c in checkpoints), config


def test_quickstart_config_one_short_epoch(tmp_path):
    LayerwiseCLI(
        args=[
            "fit",
            "--config",
            QUICKSTART,
            "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=3",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            *QUIET,
        ]
    )
    log_dir = tmp_path / "quickstart" / "version_0"
    summary = read_summary(log_dir)
    assert summary["num_samples"] == 360 and summary["layers"] == [1, 2, 3, 4, 5, 6]
    assert (log_dir / "checkpoints" / "last.ckpt").exists()
    assert list(log_dir.glob("events.out.tfevents.*"))

    # a CLI checkpoint reloads in Python without the config (hyper-parameters hold the backbone's class path)
    checkpoint_file = log_dir / "checkpoints" / "last.ckpt"
    reloaded = AlternatingAligned.load_from_checkpoint(checkpoint_file)
    state = torch.load(checkpoint_file, weights_only=False)["state_dict"]
    assert reloaded.num_layers == 6 and all(torch.equal(reloaded.state_dict()[k], v) for k, v in state.items())

    # the other subcommands on the same config and checkpoint
    common = ["--config", QUICKSTART, f"--trainer.logger.init_args.save_dir={tmp_path}", *QUIET]
    checkpoint = f"--ckpt_path={log_dir / 'checkpoints' / 'last.ckpt'}"
    LayerwiseCLI(args=["validate", *common, checkpoint])
    LayerwiseCLI(args=["test", *common, checkpoint])
    predict = LayerwiseCLI(args=["predict", *common, checkpoint, "--trainer.limit_predict_batches=1"])
    assert predict.trainer.predict_loop.predictions[0].readout.predictions.shape[0] == 6
    label = summary_file(log_dir).stem.removeprefix("val_")  # the checkpoint's epoch and step: its evaluations' too
    validated = read_summary(log_dir / f"validate_{label}")
    assert validated["accuracy"] == pytest.approx(summary["accuracy"], abs=1e-12)  # same weights, same numbers
    assert read_summary(log_dir / f"test_{label}", stage="test")["stage"] == "test"
    assert sorted(p.name for p in (tmp_path / "quickstart").iterdir()) == ["version_0"]  # no run of their own

    # `layerwise plot` renders the figures of the latest epoch to PNG and PDF
    main(["plot", str(log_dir), "--out", str(tmp_path / "figures")])
    written = {p.name for p in (tmp_path / "figures").iterdir()}
    for name in (
        "cos",
        "cka",
        "similarity_accuracy",
        "saturation",
        "early_exit",
        "effective_depth",
        "cos_distribution",
    ):
        stem = summary_file(log_dir).stem
        assert {f"{stem}_{name}.png", f"{stem}_{name}.pdf"} <= written
    with pytest.raises(SystemExit):
        main(["plot", str(tmp_path / "nowhere")])


ALL_COMMANDS = ("fit", "validate", "test", "predict", "plot", "export", "sweep", "generate", "lens")


def test_one_command_line_lists_every_command_and_each_has_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    listing = capsys.readouterr().out
    for command in ALL_COMMANDS:
        assert f"    {command} " in listing, command
    for command in ALL_COMMANDS[4:]:
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
        text = capsys.readouterr().out
        assert f"usage: layerwise {command}" in text and "--config" in text and "--print_config" in text
        assert not re.search(r"--[a-z]+-[a-z]", text.split("options:")[1]), f"{command}: flags are --snake_case"


BASE_ARGUMENTS = ("backbone", "optimizer", "lr_scheduler", "scheduler_interval", "label_smoothing", "chunk_size")
OWN_ARGUMENTS = {
    "Standard": (),
    "Aligned": ("layer_weights", "sampled_exits", "exit_sampling", "sampling_seed"),
    "AlternatingAligned": ("alternate_by", "layer_weights", "sampled_exits", "exit_sampling", "sampling_seed"),
    "CosRegularized": ("beta", "center"),
    "MultiExit": ("layer_weights", "distill_weight", "distill_temperature"),
}


@pytest.mark.parametrize("strategy", sorted(OWN_ARGUMENTS))
def test_strategies_list_the_inherited_base_arguments_in_fit_help(strategy, capsys):
    """The strategies forward ``**kwargs`` to LayerwiseModule; jsonargparse follows them, so ``fit --model.help``
    lists the base's arguments (typed, with their defaults and the base's docstring) and nothing else."""
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--model.help", strategy])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    listed = re.findall(r"^  --model\.(\w+) ", text, flags=re.MULTILINE)
    assert sorted(listed) == sorted({*BASE_ARGUMENTS, *OWN_ARGUMENTS[strategy]}), listed
    assert "kwargs" not in text
    assert "label smoothing of every cross-entropy term. (type: float, default: 0.0)" in " ".join(text.split())
    assert "--model.scheduler_interval {epoch,step}" in text


def test_an_argument_no_strategy_takes_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        quickstart_cli(tmp_path, "--model.init_args.label_smothing=0.1")
    assert "label_smothing" in one_line_error(capsys, exit_info)
    assert_nothing_written(tmp_path)


def test_plot_print_config_and_config_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plot", "runs/x", "--out", "figs", "--format", "png", "svg", "--print_config"])
    assert exit_info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["out"] == "figs" and printed["format"] == ["png", "svg"] and printed["all_epochs"] is False
    config = tmp_path / "plot.yaml"
    config.write_text("out: elsewhere\nall_epochs: true\n")
    with pytest.raises(SystemExit):
        main(["plot", "runs/x", "--config", str(config), "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["out"] == "elsewhere" and printed["all_epochs"] is True


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["export", "--checkpoint", "missing.ckpt", "--out", "o", "--depth", "1"], "--checkpoint"),
        (["sweep", "a", "--labels", "x", "y"], "--labels"),
        (["generate", "--model", "m", "--prompt", "p", "--top_k", "0"], "--top_k"),
        (["plot", "x", "--format", "gif"], "--format"),
        (["lens", "--model", "m", "--prompt", "p", "--max_new_tokens", "zero"], "max_new_tokens"),
    ],
)
def test_one_error_style_names_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and flag in err and "Traceback" not in err


def test_the_quickstart_prints_no_upstream_noise(tmp_path):
    command = [
        sys.executable,
        "-m",
        "layerwise",
        "fit",
        "--config",
        QUICKSTART,
        *TINY,
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=2",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    for noise in ("💡 Tip", "GPU available", "LeafSpec", "Warning", "warn("):
        assert noise not in output, noise
    assert "layerwise validation, epoch 0, step 2:" in output
    assert "epoch 0 done, step 2" in result.stdout and "Epoch 0/0" not in output  # not a terminal: lines, no bar
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "quickstart" / "version_0"))
    events.Reload()
    assert "hp_metric" not in events.Tags()["scalars"]


def test_python_dash_m_layerwise_works():
    result = subprocess.run([sys.executable, "-m", "layerwise", "fit", "--help"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "--model" in result.stdout and "--data" in result.stdout


# -- resuming ---------------------------------------------------------------------------------------------------


def resume_module() -> RecordingAlternating:
    torch.manual_seed(0)
    backbone = TimmViT(num_classes=4, img_size=8, patch_size=4, in_chans=1, embed_dim=16, depth=2, num_heads=2)
    return RecordingAlternating(
        backbone,
        optimizer=partial(torch.optim.AdamW, lr=1e-2),
        lr_scheduler=partial(WarmupCosineLR, warmup_epochs=1, max_epochs=2),
    )


def resume_fit(module, max_epochs, ckpt_path=None) -> pl.Trainer:
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(12, 1, 8, 8, generator=generator), torch.randint(0, 4, (12,), generator=generator))
    trainer = pl.Trainer(
        max_epochs=max_epochs,
        accelerator="cpu",
        deterministic=True,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(data, batch_size=4), ckpt_path=ckpt_path)  # 3 (odd) steps per epoch
    return trainer


@TRAINING_ONLY
def test_resume_continues_the_alternation_and_matches_an_uninterrupted_run(tmp_path):
    uninterrupted = resume_module()
    resume_fit(uninterrupted, max_epochs=2)

    first = resume_module()
    resume_fit(first, max_epochs=1).save_checkpoint(tmp_path / "step3.ckpt")
    resumed = resume_module()
    torch.manual_seed(123)  # a resumed run must not depend on the seed it was started with
    trainer = resume_fit(resumed, max_epochs=2, ckpt_path=tmp_path / "step3.ckpt")

    assert trainer.global_step == 6
    assert first.objectives + resumed.objectives == uninterrupted.objectives
    assert resumed.objectives[0] == "aligned"  # step 4 is even
    for (name, a), (_, b) in zip(uninterrupted.state_dict().items(), resumed.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-7), name


# -- bad input fails before training, naming the flag ------------------------------------------------------------


def quickstart_cli(tmp_path, *overrides):
    return LayerwiseCLI(
        args=[
            "fit",
            "--config",
            QUICKSTART,
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.max_epochs=1",
            *QUIET,
            *overrides,
        ]
    )


def assert_nothing_written(tmp_path):
    assert not any(tmp_path.rglob("*.ckpt")) and not any(tmp_path.rglob("*.json"))


def one_line_error(capsys, exit_info) -> str:
    """The CLI's error: exit code 2, one `error:` line (plus where the whole message is), no traceback."""
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err and "Given value" not in err, err
    return lines[0]


def test_unknown_backbone_names_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        quickstart_cli(tmp_path, "--model.init_args.backbone.init_args.model_name=vit_nope")
    assert "--model.init_args.backbone.init_args.model_name='vit_nope'" in one_line_error(capsys, exit_info)
    assert_nothing_written(tmp_path)


@pytest.mark.parametrize(
    ("argument", "expected"),
    [
        ("--model.init_args.label_smoothing=abc", "--model.init_args.label_smoothing: Expected a <class 'float'>"),
        ("--model.init_args.label_smoothing=2", "`--model.init_args.label_smoothing=2.0` must lie in [0, 1)"),
        ("--trainer.max_epochs=x", "--trainer.max_epochs: Expected a <class 'int'>"),
    ],
)
def test_cli_errors_are_one_line_naming_the_option(tmp_path, capsys, monkeypatch, argument, expected):
    with pytest.raises(SystemExit) as exit_info:
        quickstart_cli(tmp_path, argument)
    assert expected in one_line_error(capsys, exit_info)
    monkeypatch.setenv("LAYERWISE_DEBUG", "1")  # the whole message, or the traceback, on demand
    with pytest.raises((SystemExit, ValueError)):
        quickstart_cli(tmp_path, argument)
    assert_nothing_written(tmp_path)


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ("[1.0, 2.0]", "has 2 entries but the model has 6 layers"),
        ("[1, 1, 1, 0, 1, 1]", "must be finite and positive"),
        ("[1, -1, 1, 1, 1, 1]", "must be finite and positive"),
        ("[1, 1, .nan, 1, 1, 1]", "must be finite and positive"),
        ("[1, 1, .inf, 1, 1, 1]", "must be finite and positive"),
    ],
)
def test_bad_layer_weights_name_the_flag(tmp_path, capsys, weights, message):
    with pytest.raises(SystemExit) as exit_info:
        quickstart_cli(tmp_path, f"--model.init_args.layer_weights={weights}")
    line = one_line_error(capsys, exit_info)
    assert "--model.init_args.layer_weights" in line and message in line
    assert_nothing_written(tmp_path)


def test_pooling_outside_the_allowed_set_names_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit):
        quickstart_cli(tmp_path, "--model.init_args.backbone.init_args.pooling=max")
    assert "pooling" in capsys.readouterr().err
    with pytest.raises(ValueError, match="pooling='max'"):
        TimmViT(pooling="max", depth=1, embed_dim=8, num_heads=1, img_size=8, patch_size=4)
    assert_nothing_written(tmp_path)


def test_missing_local_data_path_names_the_flag(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    # jsonargparse re-raises the datamodule's FileNotFoundError as a ValueError: one line naming the flag
    with pytest.raises(SystemExit) as exit_info:
        LayerwiseCLI(
            args=[
                "--config",
                str(CONFIGS / "cifar10" / "deit_s_standard.yaml"),
                *TINY,
                f"--data.init_args.root={missing}",
            ],
            run=False,
        )
    assert "does not exist. Pass --data.init_args.root=" in one_line_error(capsys, exit_info)


@pytest.mark.parametrize(
    ("argument", "expected"),
    [
        ("--model.init_args.backbone.init_args.num_classes=7", "num_classes=7` but the data has 10 classes"),
        ("--model.init_args.backbone.init_args.img_size=16", "img_size=(16, 16)` but the data gives 8"),
        ("--model.init_args.backbone.init_args.in_chans=3", "in_chans=3` but the data gives 1"),
        ("--model.init_args.backbone.init_args.depth=0", "`--model.init_args.backbone.init_args.depth=0` must be"),
    ],
)
def test_model_and_data_disagreeing_fail_before_training(tmp_path, capsys, argument, expected):
    with pytest.raises(SystemExit) as exit_info:
        quickstart_cli(tmp_path, argument)
    assert expected in one_line_error(capsys, exit_info)
    assert not any(tmp_path.iterdir())  # not even a log folder


def test_epsilon_zero_is_refused():
    from layerwise.callbacks import EffectiveDepthMonitor

    with pytest.raises(ValueError, match=r"epsilons=\[0.0\]` must be .* in \(0, 1\]"):
        EffectiveDepthMonitor(epsilons=[0.0])
    with pytest.raises(SystemExit):
        main(["export", "--checkpoint", "x.ckpt", "--out", "o", "--depth", "1", "--epsilon", "0"])


def test_a_malformed_config_file_is_named(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  init_args: [\n")
    monkeypatch.setattr(sys, "argv", ["layerwise", "fit", "--config", QUICKSTART, "--config", str(bad)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert f"`--config {bad}` is not valid YAML (line 3)" in one_line_error(capsys, exit_info)


@pytest.mark.parametrize("name", ["shakespeare_gpt_alternating", "sst2_bert_aligned"])
def test_demo_config_runs_a_few_steps(name, tmp_path):
    # The documented demonstration commands, cut to two steps: the local data, the trained tokenizer, the analysis.
    data = ROOT.parent / "shared" / "data"
    if not data.is_dir():
        pytest.skip(f"the real data folder {data} is absent (the demonstrations need ../shared/data)")
    LayerwiseCLI(
        args=[
            "fit",
            f"--config={CONFIGS / 'demo' / (name + '.yaml')}",
            "--trainer.max_steps=2",
            "--trainer.max_epochs=1",
            "--trainer.val_check_interval=2",
            "--trainer.limit_val_batches=2",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            f"--data.init_args.tokenizer_dir={tmp_path / 'tokenizers'}",
            *QUIET,
        ]
    )
    summary = json.loads(next((tmp_path / name).rglob("val_epoch_*.json")).read_text())
    assert summary["depth"] == 4 and len(summary["accuracy"]) == 4
    assert ("perplexity" in summary) == ("gpt" in name)


ABLATION = sorted((CONFIGS / "ablation").glob("*.yaml"))


@pytest.mark.parametrize("config", ABLATION, ids=lambda p: p.name)
def test_residual_ablation_configs_train_the_same_mlp_with_and_without_residuals(config, tmp_path):
    cli = LayerwiseCLI(
        args=[
            "fit",
            f"--config={config}",
            "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=2",
            "--trainer.limit_val_batches=2",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
        ]
    )
    backbone = cli.model.backbone
    assert type(backbone).__name__ == "MLPBackbone" and backbone.num_layers == 8
    assert backbone.residual == (config.stem == "mlp_residual")
    summary = json.loads(next(tmp_path.rglob("val_epoch_*.json")).read_text())
    assert len(summary["cka"]) == 8 and len(summary["accuracy"]) == 8
    twin = ABLATION[0] if config == ABLATION[1] else ABLATION[1]
    differences = [
        (a, b)
        for a, b in zip(config.read_text().splitlines(), twin.read_text().splitlines())
        if a != b and "#" not in a
    ]
    assert sorted(differences) == sorted(
        [
            (f"      name: ablation_{config.stem}", f"      name: ablation_{twin.stem}"),
            (
                f"        residual: {str(backbone.residual).lower()}",
                f"        residual: {str(not backbone.residual).lower()}",
            ),
        ]
    )


@FROZEN_IN_EVAL
def test_transfer_configs_pretrain_then_probe_a_checkpoint(tmp_path):
    short = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.enable_progress_bar=false"]
    save = f"--trainer.logger.init_args.save_dir={tmp_path}"
    LayerwiseCLI(args=["fit", f"--config={CONFIGS / 'transfer' / 'digits_vit_standard.yaml'}", *short, save])
    run = tmp_path / "transfer_standard" / "version_0"
    assert {"val", "val_corrupted"} <= {p.name.split("_epoch_")[0] for p in (run / "layerwise").glob("*.json")}
    checkpoint = run / "checkpoints" / "last.ckpt"
    probe = f"--config={CONFIGS / 'transfer' / 'digits_probe.yaml'}"
    cli = LayerwiseCLI(args=["fit", probe, f"--model.init_args.checkpoint={checkpoint}", *short, save])
    assert type(cli.model).__name__ == "LinearProbes" and len(cli.model.probes) == 6
    assert not any(p.requires_grad for p in cli.model.backbone.parameters())
    with pytest.raises(SystemExit):  # no checkpoint given: one line naming the option
        LayerwiseCLI(args=["fit", probe, *short, save])


def test_a_model_summary_given_through_trainer_defaults_stays(tmp_path):
    from lightning.pytorch.callbacks import ModelSummary

    from layerwise.cli import LayerwiseCLI
    from layerwise.cli.summary import CountedModelSummary

    mine = ModelSummary(max_depth=3)
    argv = ["--config", QUICKSTART, f"--trainer.default_root_dir={tmp_path}"]
    cli = LayerwiseCLI(args=argv, run=False, trainer_defaults={"callbacks": [mine]})
    assert mine in cli.trainer.callbacks
    assert not any(isinstance(c, CountedModelSummary) for c in cli.trainer.callbacks)
    plain = LayerwiseCLI(args=argv, run=False)  # without one: Lightning's default becomes the counted summary
    assert any(isinstance(c, CountedModelSummary) for c in plain.trainer.callbacks)


def test_threads_sets_torch_and_keeps_lightnings_ddp_launcher_from_resetting_them(tmp_path, monkeypatch):
    from lightning.fabric.utilities.distributed import _set_num_threads_if_needed

    from layerwise.cli import LayerwiseCLI

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        LayerwiseCLI(args=["--config", QUICKSTART, f"--trainer.default_root_dir={tmp_path}", "--threads=1"], run=False)
        assert torch.get_num_threads() == 1
        _set_num_threads_if_needed(num_processes=1)  # what Lightning's DDP launchers call before they start ranks
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_commands_process_group_is_destroyed_at_its_exit(tmp_path):
    """Lightning destroys only NCCL groups at exit; a gloo group left to the end aborted ddp_spawn workers.

    In a fresh process: a one-rank gloo group, a check registered at exit before ClosingLine's setup (exit handlers run
    last-in first-out, so the check runs after the closing line's handler) that prints whether the group still exists.
    """
    script = tmp_path / "exit_check.py"
    script.write_text(
        "import atexit, os, torch\n"
        "from layerwise.cli.closing import ClosingLine\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=os.environ['PORT'])\n"
        "torch.distributed.init_process_group('gloo', rank=0, world_size=1)\n"
        "atexit.register(lambda: print('initialized at exit:', torch.distributed.is_initialized()))\n"
        "closing = ClosingLine('fit')\n"
        "closing.setup(None, None, 'fit')\n"
        "closing.setup(None, None, 'fit')  # a second command in the process registers nothing more\n"
    )
    env = {**os.environ, "PORT": str(free_port())}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines() == ["initialized at exit: False"]
