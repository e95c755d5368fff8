"""The configs the package ships (``layerwise fit --config quickstart`` from any folder) and their repository copies.

The installed wheel running the shipped quickstart by name is checked in CI by ``.ci/wheel_check.sh``.
"""

import sys
from pathlib import Path

import pytest
import yaml

from layerwise.cli import main
from layerwise.cli.parser import SHIPPED, with_shipped_configs

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = SHIPPED / "quickstart.yaml"


def test_every_shipped_config_is_its_repository_config_byte_for_byte():
    shipped = sorted(path.relative_to(SHIPPED) for path in SHIPPED.rglob("*") if path.is_file())
    assert Path("quickstart.yaml") in shipped
    for relative in shipped:
        assert (SHIPPED / relative).read_bytes() == (ROOT / "configs" / relative).read_bytes(), relative


@pytest.mark.parametrize(
    "given, expected",
    [
        (["fit", "--config", "quickstart"], ["fit", "--config", str(QUICKSTART)]),
        (
            ["fit", "--config=quickstart.yaml", "--trainer.max_epochs=1"],
            ["fit", f"--config={QUICKSTART}", "--trainer.max_epochs=1"],
        ),
        (["fit", "-c", "quickstart"], ["fit", "-c", str(QUICKSTART)]),
        (["fit", "--config", "configs/quickstart.yaml"], ["fit", "--config", "configs/quickstart.yaml"]),
        (["fit", "--config", "quickstrat"], ["fit", "--config", "quickstrat"]),  # not shipped: the CLI's own error
        (["fit", "--model", "quickstart"], ["fit", "--model", "quickstart"]),  # only a config flag's value
    ],
)
def test_a_shipped_config_name_becomes_its_path(given, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert with_shipped_configs(given) == expected


def test_a_file_of_the_users_own_wins_over_the_shipped_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quickstart").write_text("seed_everything: 1\n")
    assert with_shipped_configs(["fit", "--config", "quickstart"]) == ["fit", "--config", "quickstart"]


def test_the_command_line_is_rewritten_where_lightningcli_reads_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["layerwise", "fit", "--config", "quickstart"])
    assert with_shipped_configs(None) == ["fit", "--config", str(QUICKSTART)]
    assert sys.argv == ["layerwise", "fit", "--config", str(QUICKSTART)]


def test_fit_parses_the_shipped_quickstart_by_name_from_another_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["layerwise"])  # not pytest's own arguments
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", "quickstart", "--trainer.max_epochs=1", "--print_config"])
    assert exit_.value.code in (0, None)
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["trainer"]["max_epochs"] == 1
    assert config["model"]["class_path"] == "layerwise.lightning_modules.AlternatingAligned"
    assert not list(tmp_path.iterdir())  # parsed only: no run folder
