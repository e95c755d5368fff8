"""README's and the docs' numbers are the ones their scripts last measured.

A number in README or a page of ``docs/`` that a script in ``benchmarks/`` produces carries a marker right after it
(and its unit): ``about 2 <!-- claim: quickstart.minutes --> minutes``. The marker names the script's record
(``benchmarks/recorded/<name>.json``, written by ``benchmarks/_record.py``) and the key of the value (dotted for a
nested one). The stated
number must equal the recorded value rounded to the decimals README writes. Each record also says when, on what
machine and under what load it was measured, and README's sentence must say the same machine.
"""

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").rglob("*.md"))]  # README and the documentation site's pages
RECORDED = REPO / "benchmarks" / "recorded"
# a number, optionally its unit, then the marker
CLAIM = re.compile(
    r"(-?\d[\d,]*(?:\.\d+)?)\s*(?:%|×|x|s|min|minutes|points|MiB|GB|MB)?\s*<!-- claim: ([\w]+)\.([\w.]+) -->"
)


def claims() -> list[tuple[str, str, str]]:
    return [match.groups() for page in PAGES for match in CLAIM.finditer(page.read_text())]


def recorded_value(name: str, key: str):
    path = RECORDED / f"{name}.json"
    assert path.exists(), f"README cites {name}.{key}, but no script recorded benchmarks/recorded/{name}.json"
    entry = json.loads(path.read_text())
    for field in ("date", "command", "commit", "machine"):
        assert field in entry, f"{path.name} lacks {field!r}: a recorded number says when, how and where"
    value = entry["values"]
    for part in key.split("."):  # a nested value: interval_ratio.fast
        assert isinstance(value, dict) and part in value, f"{path.name} has no value {key!r}"
        value = value[part]
    return value


def test_readme_marks_its_measured_numbers():
    assert len(claims()) >= 3, "README's measured numbers lost their claim markers"


@pytest.mark.parametrize("stated, name, key", claims())
def test_stated_number_equals_the_recorded_measurement(stated, name, key):
    value = recorded_value(name, key)
    decimals = len(stated.split(".")[1]) if "." in stated else 0
    stated_value = float(stated.replace(",", ""))
    assert value is not None, f"{name}.{key} was not measured"
    assert round(float(value), decimals) == pytest.approx(stated_value), (
        f"README says {stated} for {name}.{key}; the last run of its script recorded {value}"
    )


def test_every_record_is_cited_and_every_marker_is_well_formed():
    text = "\n".join(page.read_text() for page in PAGES)
    malformed = [
        m for m in re.findall(r"<!-- claim:[^>]*-->", text) if not re.fullmatch(r"<!-- claim: \w+(?:\.\w+)+ -->", m)
    ]
    assert not malformed, malformed
    unplaced = [m for m in re.findall(r"<!-- claim: \w+(?:\.\w+)+ -->", text)]
    assert len(unplaced) == len(claims()), "a claim marker does not follow a number directly"
