"""The configs the package ships (``layerwise fit --config quickstart`` from any folder), ``layerwise configs``.

The repository's ``configs/`` is the one source: a checkout reads it, the wheel holds it as ``layerwise/configs``
(``setup.py`` copies it in at build time). The installed wheel listing and running them by name is checked by the
slow ``tests/project/test_wheel.py`` and in CI by ``.ci/wheel_check.sh``.
"""

import re
import sys
from pathlib import Path

import pytest
import yaml

import layerwise
from layerwise.cli import main
from layerwise.cli.parser import with_shipped_configs
from layerwise.commands.configs import SHIPPED, description, shipped_configs

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = SHIPPED / "quickstart.yaml"


def test_a_checkout_ships_its_own_configs_folder_every_file_by_its_name():
    assert SHIPPED == ROOT / "configs" and not (ROOT / "layerwise" / "configs").exists()  # one source, no copy
    names = shipped_configs()
    assert len(names) == len(list((ROOT / "configs").rglob("*.yaml"))) > 50
    assert names["quickstart"] == QUICKSTART and names["transfer/digits_vit_aligned"].is_file()


@pytest.mark.parametrize(
    "given, expected",
    [
        (["fit", "--config", "quickstart"], ["fit", "--config", str(QUICKSTART)]),
        (
            ["fit", "--config=quickstart.yaml", "--trainer.max_epochs=1"],
            ["fit", f"--config={QUICKSTART}", "--trainer.max_epochs=1"],
        ),
        (["fit", "-c", "quickstart"], ["fit", "-c", str(QUICKSTART)]),
        (
            ["fit", "--config", "transfer/digits_vit_aligned"],
            ["fit", "--config", str(SHIPPED / "transfer" / "digits_vit_aligned.yaml")],
        ),
        (["fit", "-c=trainer/cpu.yaml"], ["fit", f"-c={SHIPPED / 'trainer' / 'cpu.yaml'}"]),
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


def test_a_users_own_configs_folder_is_read_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "quickstart.yaml").write_text("seed_everything: 1\n")
    assert with_shipped_configs(["fit", "--config", "configs/quickstart.yaml"]) == [
        "fit",
        "--config",
        "configs/quickstart.yaml",
    ]


@pytest.mark.parametrize(
    "given, name",
    [
        (["fit", "--config", "configs/quickstart.yaml"], "quickstart"),
        (["validate", "--config=../configs/transfer/digits_probe.yaml"], "transfer/digits_probe"),
    ],
)
def test_a_missing_configs_file_that_is_shipped_names_the_shipped_config(given, name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        with_shipped_configs(given)
    assert exit_.value.code == 2
    line = capsys.readouterr().err.splitlines()[0]
    path = given[-1].partition("=")[2] or given[-1]
    assert line == (
        f"layerwise {given[0]}: error: --config: no file {path} here; the shipped config is `--config {name}` "
        "(`layerwise configs` lists them)."
    )


def test_a_missing_file_of_another_name_is_left_to_the_clis_own_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert with_shipped_configs(["fit", "--config", "configs/quickstrat.yaml"]) == [
        "fit",
        "--config",
        "configs/quickstrat.yaml",
    ]


def test_layerwise_configs_lists_every_shipped_config_with_its_first_sentence(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["configs"])
    lines = capsys.readouterr().out.splitlines()
    listed = {line.split()[0]: line.split(None, 1)[1] for line in lines[:-1]}
    assert list(listed) == sorted(shipped_configs()) and len(listed) == len(list((ROOT / "configs").rglob("*.yaml")))
    assert listed["trainer/cpu"] == "Trainer on the CPU, one process."
    assert listed["quickstart"].startswith("The offline quickstart: a small ViT")
    assert all(0 < len(text) <= 110 and "\n" not in text for text in listed.values())
    assert lines[-1].startswith(f"({len(listed)} configs in ")


def test_a_description_is_the_first_sentence_of_the_leading_comment(tmp_path):
    config = tmp_path / "a.yaml"
    config.write_text("# Transfer (App. B.4 of Jiang et al.), offline. Pretrain: more.\n# Second line.\ntrainer: {}\n")
    assert description(config) == "Transfer (App. B.4 of Jiang et al.), offline."
    config.write_text("trainer: {}\n")
    assert description(config) == ""


@pytest.mark.parametrize("name", ["quickstart", "quickstart.yaml", "transfer/digits_probe"])
def test_layerwise_configs_show_prints_the_file_as_it_is(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["configs", "show", name])
    assert capsys.readouterr().out == (ROOT / "configs" / f"{name.removesuffix('.yaml')}.yaml").read_text()


@pytest.mark.parametrize(
    "argv, said",
    [
        (["configs", "show", "quickstrat"], "no shipped config 'quickstrat'"),
        (["configs", "show"], "give the config's name"),
        (["configs", "quickstart"], "give `layerwise configs show quickstart`"),
    ],
)
def test_layerwise_configs_errors_are_one_line(argv, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and said in capsys.readouterr().err.splitlines()[0]


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_the_version_is_one_line(flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([flag])
    assert exit_.value.code in (0, None)
    assert capsys.readouterr().out == f"layerwise {layerwise.__version__}\n"


def test_the_top_level_help_says_the_version_and_that_configs_have_names(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"layerwise {layerwise.__version__}:" in out and "layerwise configs" in out and "--version" in out


def test_fit_help_says_that_a_config_can_be_named(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--help"])
    assert exit_.value.code in (0, None)
    out = " ".join(capsys.readouterr().out.split())
    assert "the name of a config the package ships (`--config quickstart`" in out


def test_a_file_the_shipped_configs_name_by_its_checkout_path_is_found_in_any_folder(tmp_path, monkeypatch):
    from layerwise.commands.coupling import load_prompts

    monkeypatch.chdir(tmp_path)  # configs/coupling/pythia.yaml: `prompts: configs/coupling/prompts.txt`
    lines = [line for line in (ROOT / "configs" / "coupling" / "prompts.txt").read_text().splitlines() if line.strip()]
    assert load_prompts("configs/coupling/prompts.txt", 1000) == lines
    with pytest.raises(ValueError, match="is not a file"):
        load_prompts("myconfigs/coupling/prompts.txt", 10)


def test_the_docs_and_the_configs_own_comments_name_the_shipped_configs():
    """A command copied from the docs or from `layerwise configs show` runs from an installed wheel too."""
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "configs").rglob("*.yaml")]
    by_path = [
        f"{page.relative_to(ROOT)}:{number}"
        for page in pages
        for number, line in enumerate(page.read_text().splitlines(), start=1)
        if re.search(r"(--config[ =]|-c )configs/", line)
    ]
    assert not by_path
