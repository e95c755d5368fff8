"""The troubleshooting table (docs/troubleshooting.md) shows the messages as the commands print them.

Each case runs a command the way a user mistypes it and matches the printed `error:` line against the table's row that
describes it; a "…" in the table stands for the parts that depend on the user's paths and files.
"""

import re
from pathlib import Path

import pytest
import torch
import yaml

from layerwise.cli import main

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def readme_messages() -> list[str]:
    """The code spans of the first column of the troubleshooting table (docs/troubleshooting.md)."""
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    table = text.split("# Troubleshooting", 1)[1].split("\n## ", 1)[0]
    spans = []
    for row in table.splitlines():
        if row.startswith("| ") and not row.startswith("| what you see"):
            first = row[2:].split(" | ", 1)[0]
            spans += [match.group(2) for match in re.finditer(r"(`+) ?(.+?) ?\1(?!`)", first)]
    return spans


def as_pattern(message: str) -> re.Pattern:
    """README's message as a regex: "…" matches anything within the line."""
    return re.compile(".*?".join(re.escape(part) for part in message.split("…")))


def printed_error(capsys, args: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(lines) == 1, lines
    return lines[0]


def readme_row(key: str) -> str:
    rows = [message for message in readme_messages() if key in message]
    assert len(rows) == 1, f"README's troubleshooting table has {len(rows)} messages holding {key!r}"
    return rows[0]


def test_readme_table_is_parsed():
    messages = readme_messages()
    assert len(messages) >= 20 and any("quickstrat.yaml" in message for message in messages)


def quickstart_with(tmp_path, **changes) -> str:
    config = yaml.safe_load(QUICKSTART.read_text())
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = config
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def cases(tmp_path: Path) -> dict[str, list[str]]:
    """README key -> the command that prints it."""
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("trainer:\n  max_epochs: 1\nmodel: [\n")
    truncated = tmp_path / "last.ckpt"
    torch.save({"state_dict": {"weight": torch.zeros(10_000)}}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:20_000])
    root = [f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"]
    return {
        "quickstrat.yaml": ["fit", "--config", str(ROOT / "configs" / "quickstrat.yaml")],
        "is not valid YAML": ["fit", "--config", bad_yaml.name],  # run in tmp_path, as README names it
        "no class named": ["fit", "--config", str(QUICKSTART), "--model", "AlternatingAligend", *root],
        "lightning_modules.AlternatingAligend": [
            "fit",
            "--config",
            str(QUICKSTART),
            "--model",
            "layerwise.lightning_modules.AlternatingAligend",
            *root,
        ],
        "no such file": ["validate", "--config", str(QUICKSTART), "--ckpt_path", str(tmp_path / "x.ckpt"), *root],
        "max_epochs=0": ["fit", "--config", str(QUICKSTART), "--trainer.max_epochs=0", *root],
        "is truncated": ["validate", "--config", str(QUICKSTART), "--ckpt_path", str(truncated), *root],
        "outside the 6 blocks": [
            "fit",
            "--config",
            quickstart_with(tmp_path, **{"trainer.callbacks.0.init_args.layers": [9]}),
            *root,
        ],
    }


@pytest.mark.parametrize(
    "key",
    [
        "quickstrat.yaml",
        "is not valid YAML",
        "no class named",
        "lightning_modules.AlternatingAligend",
        "no such file",
        "max_epochs=0",
        "is truncated",
        "outside the 6 blocks",
    ],
)
def test_readme_troubleshooting_message_is_the_printed_one(tmp_path, capsys, monkeypatch, key):
    monkeypatch.chdir(tmp_path)
    line = printed_error(capsys, cases(tmp_path)[key])
    message = readme_row(key)
    assert as_pattern(message).search(line), f"README: {message!r}\nprinted: {line!r}"
