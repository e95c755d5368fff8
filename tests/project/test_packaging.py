"""Packaging: the core imports without the optional extras, one version source, typed package."""

import subprocess
import sys
import textwrap
from pathlib import Path

import tomllib

import layerwise

ROOT = Path(__file__).resolve().parents[2]

BLOCKED = textwrap.dedent(
    """
    import sys

    HIDDEN = {"timm", "torchvision", "transformers", "tokenizers", "datasets"}

    class Hide:
        # wraps a finder so that the extras look uninstalled, to imports and to find_spec alike

        def __init__(self, finder):
            self.finder = finder

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in HIDDEN or not hasattr(self.finder, "find_spec"):
                return None
            return self.finder.find_spec(name, path, target)

        def find_distributions(self, *args, **kwargs):
            found = getattr(self.finder, "find_distributions", lambda *a, **k: [])(*args, **kwargs)
            return [dist for dist in found if dist.metadata["Name"].lower() not in HIDDEN]

        def invalidate_caches(self):
            getattr(self.finder, "invalidate_caches", lambda: None)()

    sys.meta_path[:] = [Hide(finder) for finder in sys.meta_path]
    """
)


def test_the_core_imports_without_the_extras_and_names_the_extra_when_needed():
    script = BLOCKED + textwrap.dedent(
        """
        import layerwise.cli, layerwise.callbacks, layerwise.metrics
        from layerwise.datamodules import DigitsDataModule
        from layerwise.lightning_modules import Aligned
        DigitsDataModule()
        for build in (lambda: __import__("layerwise.datamodules", fromlist=["x"]).CIFAR10DataModule,
                      lambda: layerwise.features.TimmViT()):
            try:
                build()
            except ImportError as error:
                print("ERROR", error)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    errors = [line for line in result.stdout.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 2 and all("layerwise[vision]" in line for line in errors), result.stdout


def test_one_version_source_extras_and_py_typed():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    assert layerwise.__version__.count(".") == 2
    extras = project["optional-dependencies"]
    assert {"vision", "text", "dev"} <= set(extras)
    names = {dependency.split(">")[0].split("[")[0].split("=")[0] for dependency in project["dependencies"]}
    assert not names & {"timm", "torchvision", "transformers", "tokenizers", "datasets"}
    assert (ROOT / "layerwise" / "py.typed").exists()
