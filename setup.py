"""The build's one step beyond pyproject.toml: the repository's configs/ goes into the wheel as layerwise/configs.

configs/ stays the one source (no copy in the package to keep in step): ``layerwise --config NAME`` and
``layerwise configs`` read ``layerwise/configs`` in an installed wheel and ``configs/`` in a checkout
(``layerwise.commands.configs.shipped_folder``). The sdist carries configs/ (MANIFEST.in), so a wheel built from it
has them too.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithConfigs(build_py):
    """``build_py``, then every file under ``configs/`` copied to ``layerwise/configs/`` in the build."""

    def run(self) -> None:
        super().run()
        source = Path(__file__).resolve().parent / "configs"
        shutil.copytree(source, Path(self.build_lib) / "layerwise" / "configs", dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildWithConfigs})
