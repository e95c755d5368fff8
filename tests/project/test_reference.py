"""The API reference is complete: every parameter of a public class documented under its own name (so the site shows
its type and default, never a group marked "required"), the defaults' values shown, and every key a quickstart run
logs listed on the callbacks' reference page."""

import csv
import importlib
import inspect
import re
from pathlib import Path

import pytest
from docstring_parser import parse

from layerwise.analyses.effective_depth import DEFAULT_EPSILONS
from layerwise.analyses.logit_lens import DEFAULT_THRESHOLDS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [  # the packages the API reference pages render (docs/reference/)
    "layerwise.callbacks",
    "layerwise.lightning_modules",
    "layerwise.datamodules",
    "layerwise.metrics",
    "layerwise.features",
]
PUBLIC = [
    (package, name)
    for package in PACKAGES
    for name in importlib.import_module(package).__all__
    if inspect.isclass(getattr(importlib.import_module(package), name))
]


def accepted_parameters(cls) -> set[str]:
    """The parameters ``cls(...)`` takes: its own, and while its ``__init__`` forwards ``**kwargs``, its parents'
    (as jsonargparse follows them for ``--help``: a strategy inherits the base module's arguments)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(klass.__init__).parameters
        names |= {p.name for p in parameters.values()}
        forwards = [p.name for p in parameters.values() if p.kind is p.VAR_KEYWORD]
        names |= {f"**{name}" for name in forwards}
        if not forwards:
            break
    return names


@pytest.mark.parametrize("package, name", PUBLIC, ids=[f"{p}.{n}" for p, n in PUBLIC])
def test_every_documented_parameter_is_one_parameter_of_the_signature(package, name):
    cls = getattr(importlib.import_module(package), name)
    names = accepted_parameters(cls)
    documented = [param.arg_name for param in parse(cls.__doc__ or "").params if param.args[0] == "param"]
    assert not [arg for arg in documented if arg not in names], f"{name}: documented {documented}, signature {names}"


def shown(values) -> str:
    return ", ".join(f"{value:g}" for value in values)


@pytest.mark.parametrize("package, name", PUBLIC, ids=[f"{p}.{n}" for p, n in PUBLIC])
def test_a_default_named_by_a_constant_is_shown_with_its_values(package, name):
    cls = getattr(importlib.import_module(package), name)
    defaults = {p.default for p in inspect.signature(cls.__init__).parameters.values()}
    doc = " ".join((cls.__doc__ or "").split())
    for constant, label in ((DEFAULT_THRESHOLDS, "DEFAULT_THRESHOLDS"), (DEFAULT_EPSILONS, "DEFAULT_EPSILONS")):
        if any(default is constant for default in defaults):
            assert f"``{label}``: {shown(constant)}" in doc, f"{name}: the values of {label} are not shown"


def generic(key: str) -> str:
    """A logged key as the reference writes it: ``val/acc/layer_03`` -> ``val/acc/layer_XX``."""
    key = re.sub(r"layer_\d+$", "layer_XX", key)
    key = re.sub(r"tau_[\d.]+$", "tau_T", key)
    key = re.sub(r"eps_[\d.]+$", "eps_E", key)
    return re.sub(r"score_k\d+$", "score_kK", key)


def test_every_key_the_quickstart_logs_is_on_the_callbacks_reference_page(tmp_path, monkeypatch):
    from layerwise.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAYERWISE_FIGURES", "thread")
    main(
        [
            *("fit", "--config", "quickstart", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2"),
            "--trainer.log_every_n_steps=1",
            *("--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={tmp_path}"),
        ]
    )
    (metrics,) = tmp_path.rglob("metrics.csv")
    with metrics.open() as file:
        logged = set(next(csv.reader(file))) - {"epoch", "step"}
    assert {"val/acc/layer_01", "val/trajectory/lss", "val/residual_ratio/mlp/layer_06", "train/loss"} <= logged
    page = (ROOT / "docs" / "reference" / "callbacks.md").read_text()
    listed = set(re.findall(r"`([a-z_]+/[^`\s]+)`", page))
    assert not sorted({generic(key) for key in logged} - listed)
