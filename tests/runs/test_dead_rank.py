"""A rank that dies mid-epoch ends the run: the others stop within the configured bound, naming it in one line.

Two CPU processes with gloo under Lightning's ``ddp`` launcher (the shipped quickstart, cut small), the process
group timeout set on the command line as a user does (``--trainer.strategy.init_args.timeout``). Rank 1 dies in the
second epoch (``dying.Die``: ``kill -9`` of itself, an exception on that rank only, or SIGSTOP: alive but silent).
Rank 0 must exit non-zero with exactly one error line naming rank 1 and how it ended (or, for the hung rank, the
timeout), naming the last complete checkpoint, which loads. How long detection takes is measured in
``benchmarks/dead_rank.py``, not asserted here; the bound asserted is the configured timeout itself.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from runs.dying import DIES, dying_fit

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="kills a process as on a Linux node")


def run_with_a_dying_rank(cwd: Path, how: str, timeout: str) -> tuple[subprocess.CompletedProcess, float, int]:
    """The 2-process fit whose rank 1 dies ``how``; the finished command, when rank 1 died, and its pid."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MASTER_", "LOCAL_RANK", "WORLD_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "runs"), env.get("PYTHONPATH", "")])  # every rank
    finished = subprocess.run(dying_fit(how, timeout), cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    ended = time.time()
    died = re.search(DIES, finished.stdout, re.MULTILINE)
    assert died, f"rank 1 did not die\n{finished.stdout[-3000:]}\n{finished.stderr[-3000:]}"
    return finished, ended - float(died.group(2)), int(died.group(1))


def check_one_line_and_the_checkpoint(finished: subprocess.CompletedProcess, cwd: Path) -> str:
    """Exit 1, exactly one ``layerwise fit: error:`` line (the last of stderr), naming the last checkpoint, loadable."""
    errors = [line for line in finished.stderr.splitlines() if line.startswith("layerwise fit: error:")]
    assert finished.returncode == 1, f"rc {finished.returncode}\n{finished.stderr[-4000:]}"
    assert len(errors) == 1 and finished.stderr.strip().splitlines()[-1] == errors[0], finished.stderr[-4000:]
    checkpoint = Path("runs/quickstart/version_0/checkpoints/last.ckpt")
    assert errors[0].endswith(f"The last complete checkpoint: {checkpoint} (resume with --ckpt_path)."), errors[0]
    saved = torch.load(cwd / checkpoint, map_location="cpu", weights_only=True)
    assert (saved["epoch"], saved["global_step"]) == (0, 4)  # the first epoch's, whole
    assert "closing" not in finished.stdout and not re.search(r"^layerwise fit: \d+ epoch", finished.stdout, re.M)
    return errors[0]


def test_rank_1_killed_mid_epoch_ends_rank_0_within_the_bound_naming_it(tmp_path):
    finished, elapsed, _ = run_with_a_dying_rank(tmp_path, "kill", "0:05:00")
    line = check_one_line_and_the_checkpoint(finished, tmp_path)
    assert line.startswith("layerwise fit: error: rank 1 killed by signal 9 (SIGKILL) at epoch 1, step "), line
    assert elapsed < 300  # the configured bound (detection itself takes about a second: benchmarks/dead_rank.py)


@pytest.mark.slow
def test_an_exception_on_rank_1_only_ends_rank_0_naming_it(tmp_path):
    finished, elapsed, _ = run_with_a_dying_rank(tmp_path, "raise", "0:05:00")
    line = check_one_line_and_the_checkpoint(finished, tmp_path)
    expected = "layerwise fit: error: rank 1 failed (RuntimeError: rank 1 failed on purpose) at epoch 1, step "
    assert line.startswith(expected), line
    assert elapsed < 300


@pytest.mark.slow
def test_a_hung_rank_ends_the_run_at_the_process_group_timeout_and_is_killed(tmp_path):
    finished, elapsed, pid = run_with_a_dying_rank(tmp_path, "stop", "0:01:30")
    line = check_one_line_and_the_checkpoint(finished, tmp_path)
    expected = "a collective waited past the process group timeout (--trainer.strategy.init_args.timeout=0:01:30)"
    assert expected in line and "another rank hangs" in line, line
    assert not Path(f"/proc/{pid}").exists(), "the hung rank outlived the command"
    assert 90 <= elapsed < 300  # not before the timeout, and not long after it
