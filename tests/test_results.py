"""The one atomic writer: whole files or none, readable by others, no temporary left behind."""

import os
import stat

import pytest

from layerwise.results import write_atomic, write_text_atomic


def test_written_files_have_the_permissions_open_gives(tmp_path):
    path = write_text_atomic(tmp_path / "sub" / "a.json", "{}")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert path.read_text() == "{}" and os.listdir(path.parent) == ["a.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = write_text_atomic(tmp_path / "a.json", "old")

    def half_then_fail(file):
        file.write(b"new, half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, half_then_fail)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["a.json"]
