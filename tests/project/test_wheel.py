"""The release as a user gets it: the built wheel installed outside the repository runs every documented command.

One slow module (``pytest -m slow tests/project/test_wheel.py``, in ``.ci/run``): the sdist and the wheel are built
from this checkout (``python -m build --no-isolation``: the wheel from the sdist, as an index's builder would),
``twine check --strict`` passes them, the sdist holds ``examples/`` and ``configs/``, the wheel every file of
``configs/`` byte for byte. Then the wheel is installed with ``--no-deps`` into a fresh virtual environment in a
temporary folder; its dependencies are the test environment's own, seen through a ``.pth`` line placed after the new
environment's site-packages (nothing is downloaded: no 5.9 GB torch; this environment's editable layerwise is not
seen, its finder being in a ``.pth`` file that a plain path line does not run). From a folder outside the
repository, with no ``PYTHONPATH``: ``layerwise --version``, ``layerwise configs`` (every config listed), and every
runnable ``bash`` block of README and docs/ (the ones ``test_docs_code.py`` runs from the checkout, cut the same way),
each quoted output checked as there.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
from test_docs_code import CUT, RUNNABLE, TRAINER_COMMANDS, assert_quoted, commands, page_blocks

import layerwise

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted(
    path.relative_to(REPO / "configs").as_posix() for path in (REPO / "configs").rglob("*") if path.is_file()
)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and the wheel, built from a copy of this checkout's tracked and new files (the checkout untouched)."""
    source = tmp_path_factory.mktemp("source")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for name in listed:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


def the(dist: Path, pattern: str) -> Path:
    (found,) = dist.glob(pattern)
    return found


def test_twine_check_strict_passes_the_sdist_and_the_wheel(dist):
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, sorted(dist.iterdir()))],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0 and checked.stdout.count("PASSED") == 2, checked.stdout + checked.stderr


def test_the_sdist_holds_the_examples_and_the_configs(dist):
    with tarfile.open(the(dist, "layerwise-*.tar.gz")) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert "examples/feature_norm.py" in names and "setup.py" in names and "DESCRIPTION.md" in names
    assert {f"configs/{name}" for name in CONFIGS} <= names


def test_the_wheel_holds_every_config_byte_for_byte(dist):
    with zipfile.ZipFile(the(dist, "layerwise-*-py3-none-any.whl")) as wheel:
        shipped = sorted(name.removeprefix("layerwise/configs/") for name in wheel.namelist() if "/configs/" in name)
        assert shipped == CONFIGS
        for name in CONFIGS:
            assert wheel.read(f"layerwise/configs/{name}") == (REPO / "configs" / name).read_bytes(), name
        metadata = wheel.read(f"layerwise-{layerwise.__version__}.dist-info/METADATA").decode()
    assert "Classifier: Typing :: Typed" in metadata and "Keywords: " in metadata and "Author: " in metadata


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A fresh environment holding only the wheel (its dependencies: this one's), and the variables to run it."""
    venv = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    inner = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(inner) / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # after its own
    wheel = the(dist, "layerwise-*-py3-none-any.whl")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--quiet",
            "--no-deps",
            str(wheel),
        ],
        check=True,
    )
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment.update(COLUMNS="100", LAYERWISE_FIGURES="thread", PATH=f"{venv / 'bin'}:{environment['PATH']}")
    return venv, environment


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("user")
    assert REPO not in folder.parents
    return folder


def layerwise_command(installed, folder: Path, *args: str) -> subprocess.CompletedProcess:
    venv, environment = installed
    return subprocess.run(
        [str(venv / "bin" / "layerwise"), *args], cwd=folder, env=environment, capture_output=True, text=True
    )


def test_the_installed_package_is_the_wheels(installed, outside):
    venv, environment = installed
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import layerwise; print(layerwise.__file__)"],
        cwd=outside,
        env=environment,
        capture_output=True,
        text=True,
    )
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr


def test_the_wheel_answers_its_version_and_lists_every_config(installed, outside):
    version = layerwise_command(installed, outside, "--version")
    assert version.stdout == f"layerwise {layerwise.__version__}\n", version.stderr
    listed = layerwise_command(installed, outside, "configs")
    names = [line.split()[0] for line in listed.stdout.splitlines()[:-1]]
    assert names == sorted(name.removesuffix(".yaml") for name in CONFIGS if name.endswith(".yaml")), listed.stderr
    shown = layerwise_command(installed, outside, "configs", "show", "transfer/digits_vit_aligned")
    assert shown.stdout == (REPO / "configs" / "transfer" / "digits_vit_aligned.yaml").read_text()
    missing = layerwise_command(installed, outside, "fit", "--config", "configs/quickstart.yaml")
    assert missing.returncode == 2 and "the shipped config is `--config quickstart`" in missing.stderr


BASH = [block for block in RUNNABLE if block.language == "bash"]


def test_every_runnable_command_of_the_docs_runs_from_the_wheel(installed, outside):
    assert len(BASH) >= 8
    ran: dict[str, str] = {}
    for block in BASH:
        printed = ""
        for words in commands(block.code):
            args = words[1:] + (CUT if words[1] in TRAINER_COMMANDS else [])
            key = " ".join(args)
            if key not in ran:
                result = layerwise_command(installed, outside, *args)
                assert result.returncode == 0, (
                    f"{block.id}: `layerwise {key}` exited {result.returncode}:\n{result.stderr[-3000:]}"
                )
                ran[key] = result.stdout + result.stderr
            printed += ran[key]
        following = next((later for later in page_blocks(block.page) if later.line > block.line), None)
        if following is not None and following.marker == "output":
            assert_quoted(following, printed)
    assert not (outside / "configs").exists()
