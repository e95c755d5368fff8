"""Every entry of tests/conftest.py's HEAVY names a test file or a test that exists: a typo would silently leave a
heavy check in the default suite (or a renamed one out of `pytest -m heavy`)."""

import re
from pathlib import Path

from conftest import HEAVY

ROOT = Path(__file__).resolve().parents[2]


def test_every_heavy_entry_names_a_file_or_a_test_that_exists():
    for entry in HEAVY:
        path, _, test = entry.partition("::")
        file = ROOT / path
        assert file.is_file(), f"HEAVY names {path}, which does not exist"
        if test:
            assert re.search(rf"^def {re.escape(test)}\(", file.read_text(encoding="utf-8"), re.M), entry
