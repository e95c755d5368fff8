"""Every command's ``--help`` answers without importing torch, transformers or Lightning.

Wall time is measured in ``benchmarks/startup.py``; here the cause of a slow help is checked instead: a fresh process
runs ``layerwise COMMAND --help`` and reports which heavy packages it imported.
"""

import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from layerwise.cli.app import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "lightning", "torchmetrics", "matplotlib", "numpy")
PROBE = """
import json, runpy, sys
sys.argv = ["layerwise", *sys.argv[1:]]
code = None
try:
    runpy.run_module("layerwise", run_name="__main__")
except SystemExit as stop:
    code = stop.code
print(json.dumps({"code": code, "heavy": [name for name in HEAVY if name in sys.modules]}))
""".replace("HEAVY", repr(HEAVY))


def help_of(command: str, **environment: str) -> tuple[dict, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.update(environment)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, command, "--help"], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    *text, last = done.stdout.strip().splitlines()
    return json.loads(last), "\n".join(text)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_command_help_imports_no_heavy_package(command):
    probe, text = help_of(command)
    assert probe["code"] in (0, None) and f"usage: layerwise {command}" in text
    assert probe["heavy"] == [], f"`layerwise {command} --help` imported {probe['heavy']}"


def test_trainer_command_help_is_rendered_once_then_read_without_lightning(tmp_path):
    """``fit --help`` needs Lightning to render (6 s of imports); the text is kept, keyed by packages, source and
    width, so the next ``fit --help`` imports nothing heavy and prints the same text; another width renders again."""
    store = {"LAYERWISE_CACHE_DIR": str(tmp_path), "COLUMNS": "100"}
    first_probe, first = help_of("fit", **store)
    assert "lightning" in first_probe["heavy"] and "--trainer.max_epochs" in first and "--model" in first
    assert len(list(tmp_path.glob("fit-*.txt"))) == 1
    again_probe, again = help_of("fit", **store)
    assert again_probe["heavy"] == [] and again == first
    wide_probe, wide = help_of("fit", **{**store, "COLUMNS": "160"})
    assert "lightning" in wide_probe["heavy"] and wide != first  # another key: rendered again, the old text dropped
    assert len(list(tmp_path.glob("fit-*.txt"))) == 1
    validate_probe, validate = help_of("validate", **store)
    assert "lightning" in validate_probe["heavy"] and "usage: layerwise [options] validate" in validate


def test_help_key_follows_what_the_text_depends_on(monkeypatch):
    from importlib import metadata

    from layerwise.cli import help_cache

    key = help_cache.help_key("fit")
    assert help_cache.help_key("fit") == key and help_cache.help_key("test") != key
    monkeypatch.setenv("COLUMNS", "123")
    assert help_cache.help_key("fit") != key
    monkeypatch.delenv("COLUMNS")
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "0.0" if name == "lightning" else real(name))
    assert help_cache.help_key("fit") != key
    assert help_cache.is_plain_help(["fit", "--help"]) and help_cache.is_plain_help(["fit", "-h"])
    assert not help_cache.is_plain_help(["fit", "--config", "x.yaml", "--help"])


def test_coupling_keeps_the_metrics_choices():
    """engines/coupling.py repeats two Literal types of the metrics (the command needs no torch): they stay equal."""
    from layerwise.engines import coupling
    from layerwise.metrics import functional_dynamics

    for name in ("CouplingForm", "SvdMethod"):
        assert typing.get_args(getattr(coupling, name)) == typing.get_args(getattr(functional_dynamics, name)), name


def test_lazy_no_grad_turns_gradients_off():
    import torch

    from layerwise.commands._lazy import no_grad

    @no_grad
    def grad_enabled() -> bool:
        return torch.is_grad_enabled()

    assert torch.is_grad_enabled() and not grad_enabled() and torch.is_grad_enabled()


def test_top_level_help_lists_commands_without_a_stray_line_and_no_command_is_an_error(capsys):
    from layerwise.cli import main
    from layerwise.cli.app import TRAINER_COMMANDS

    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "usage: layerwise COMMAND" in out and "(required)" not in out
    assert all(f"    {name} " in out for name in [*TRAINER_COMMANDS, *COMMANDS])
    with pytest.raises(SystemExit) as stop:
        main([])
    assert stop.value.code == 2 and "error: give a command, one of fit, validate" in capsys.readouterr().err
