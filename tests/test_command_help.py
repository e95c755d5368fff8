"""Every command's ``--help`` answers without importing torch, transformers or Lightning (issue 23.14).

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

from layerwise.cli import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
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


def help_of(command: str) -> tuple[dict, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
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


def test_coupling_keeps_the_metrics_choices():
    """coupling.py repeats two Literal types of the metrics (so its --help needs no torch): they must stay equal."""
    from layerwise.inference import coupling
    from layerwise.metrics import functional_dynamics

    for name in ("CouplingForm", "SvdMethod"):
        assert typing.get_args(getattr(coupling, name)) == typing.get_args(getattr(functional_dynamics, name)), name


def test_lazy_no_grad_turns_gradients_off():
    import torch

    from layerwise.inference._lazy import no_grad

    @no_grad
    def grad_enabled() -> bool:
        return torch.is_grad_enabled()

    assert torch.is_grad_enabled() and not grad_enabled() and torch.is_grad_enabled()
