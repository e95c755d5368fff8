"""The one atomic writer: whole files or none, readable by others, no temporary left behind."""

import json
import os
import stat
import time

import pytest

import layerwise
from layerwise.cli import main
from layerwise.results import (
    find_summaries,
    latest_summary,
    load_summary,
    merge_summary,
    write_atomic,
    write_text_atomic,
)


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


def test_a_corrupt_summary_is_moved_aside_with_a_warning_and_written_anew(tmp_path):
    path = tmp_path / "layerwise" / "val_epoch_000.json"
    path.parent.mkdir()
    for bad in ('{"epoch": 0, "accura', "[1, 2, 3]", "\udcff".encode("utf-8", "surrogatepass").decode("latin-1")):
        path.write_text(bad)
        with pytest.warns(UserWarning, match=r"val_epoch_000.json is not .*Moved it to val_epoch_000.json.corrupt-"):
            merge_summary(path, {"epoch": 0, "layers": [1], "accuracy": [0.5]}, run_id="new")
        assert load_summary(path) == {
            "run_id": "new",
            "layerwise_version": layerwise.__version__,
            "epoch": 0,
            "layers": [1],
            "accuracy": [0.5],
        }
        for aside in tmp_path.glob("layerwise/*.corrupt-*"):
            aside.unlink()


def test_plot_on_a_corrupt_summary_names_the_file(tmp_path, capsys):
    path = tmp_path / "val_epoch_000.json"
    path.write_text("{not json")
    with pytest.raises(SystemExit) as exit_info:
        main(["plot", str(path)])
    assert exit_info.value.code == 2 and f"{path} is not a readable layerwise summary" in capsys.readouterr().err


def test_the_fit_run_is_chosen_over_a_later_validation_run(tmp_path, capsys):
    fit_run, validate_run = tmp_path / "exp" / "version_0", tmp_path / "exp" / "version_1"
    for epoch in range(3):
        write_text_atomic(fit_run / "layerwise" / f"val_epoch_{epoch:03d}.json", json.dumps({"epoch": epoch}))
    time.sleep(0.01)
    # an evaluation in the checkpoint's run, and one of an older layerwise in a version of its own (at step 0)
    evaluation = fit_run / "validate_epoch_002_step_0000030" / "layerwise" / "val_epoch_002_step_0000030.json"
    write_text_atomic(evaluation, json.dumps({"epoch": 2}))
    write_text_atomic(validate_run / "layerwise" / "val_epoch_000_step_0000000.json", json.dumps({"epoch": 0}))
    assert find_summaries(tmp_path / "exp") == [fit_run / "layerwise" / "val_epoch_002.json"]
    assert len(find_summaries(tmp_path / "exp", all_epochs=True)) == 3
    assert find_summaries(validate_run) == [validate_run / "layerwise" / "val_epoch_000_step_0000000.json"]
    assert find_summaries(evaluation.parent.parent) == [evaluation]  # asked explicitly
    assert latest_summary(tmp_path / "exp").parent.parent == fit_run
