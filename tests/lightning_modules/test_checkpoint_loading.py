"""The one checkpoint loader: nothing imported before the class path is checked, clear errors for bad files."""

import sys

import pytest
import torch

from layerwise.engines.checkpoint import load_module


def test_a_foreign_class_path_is_refused_before_anything_is_imported(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "evil_module.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Evil: pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    checkpoint = tmp_path / "evil.ckpt"
    torch.save({"hyper_parameters": {"_class_path": "evil_module.Evil"}, "state_dict": {}}, checkpoint)
    with pytest.raises(ValueError, match=r"--checkpoint=.*evil_module.Evil.*outside the trusted packages"):
        load_module(checkpoint)
    assert not marker.exists() and "evil_module" not in sys.modules


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"PK\x03\x04 truncated", "is truncated"),
        (None, "no hyper_parameters"),
    ],
)
def test_bad_files_get_one_line_naming_the_flag(tmp_path, content, message):
    checkpoint = tmp_path / "bad.ckpt"
    if content is None:
        torch.save({"state_dict": {}}, checkpoint)
    else:
        checkpoint.write_bytes(content)
    with pytest.raises(ValueError, match=rf"--checkpoint=.*{message}"):
        load_module(checkpoint)
    with pytest.raises(ValueError, match="no such file"):
        load_module(tmp_path / "missing.ckpt")
