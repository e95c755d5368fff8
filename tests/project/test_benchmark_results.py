"""``benchmarks/RESULTS.md`` and ``benchmarks/recorded/`` hold the current figures, not a log of every run.

One record per script case and machine kind: ``<name>.json`` measured on the CPU, ``<name>_cuda_<gpu>.json`` on a GPU
(the suffix that ``benchmarks/_record.py`` adds from the device), ``<name>`` starting with the name of the script that
wrote it; no commit, run number or scratch file. RESULTS.md has one section per script that records, names every
record, and keeps no superseded section (history is git's).
"""

import importlib.util
import json
import re
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RECORDED = BENCHMARKS / "recorded"
RESULTS = BENCHMARKS / "RESULTS.md"
SCRIPTS = sorted(path.stem for path in BENCHMARKS.glob("*.py") if not path.name.startswith("_"))
NAME = re.compile(r"(?P<name>[a-z][a-z0-9_]*?)(?P<kind>_cuda_[a-z]+\d+[a-z]*)?\.json")
# what the old log's names carried: a commit (7 hex digits with a digit in them), a second run, a before/after pair
HISTORY = re.compile(r"_(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?=_|\.)|_run\d|before_after|_old|_new")
RECORDS = sorted(path.name for path in RECORDED.iterdir())


def _gpu_kind(device_name: str) -> str:
    """The suffix the writer gives a GPU (``benchmarks/_record.py`` is a script's module, not the package's)."""
    spec = importlib.util.spec_from_file_location("_record", BENCHMARKS / "_record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.gpu_kind(device_name)


def test_the_name_scheme_tells_commits_and_runs_apart():
    for good in ("callback_overhead_deit_s_cuda_h200.json", "threads_40_epochs.json", "compare_precision.json"):
        assert NAME.fullmatch(good) and not HISTORY.search(good), good
    for bad in (
        "compare_precision_cuda_tf32_7084f6c.json",
        "compare_precision_cuda_tf32_run2.json",
        "compare_precision_cuda_before_after_h100.txt",
        "callback_overhead_deit_s_cuda_8192_workers_14964df.json",
    ):
        assert not NAME.fullmatch(bad) or HISTORY.search(bad), bad
    assert _gpu_kind("NVIDIA H100 80GB HBM3") == "_cuda_h100" and _gpu_kind("NVIDIA H200") == "_cuda_h200"


@pytest.mark.parametrize("filename", RECORDS)
def test_a_record_is_named_by_its_script_case_and_machine_kind(filename):
    match = NAME.fullmatch(filename)
    assert match, f"benchmarks/recorded/{filename}: not <name>.json or <name>_cuda_<gpu>.json (a scratch file?)"
    assert not HISTORY.search(filename), f"{filename} names a commit or a run: a re-run replaces the record"
    name = match["name"]
    assert any(name == script or name.startswith(script + "_") for script in SCRIPTS), (
        f"{filename}: no script in benchmarks/ is named like it ({name} should start with a script's name)"
    )
    cuda = json.loads((RECORDED / filename).read_text())["machine"]["cuda"]
    expected = _gpu_kind(cuda) if cuda and match["kind"] else ""
    assert (match["kind"] or "") == expected, (
        f"{filename} says {match['kind'] or 'the CPU'}; measured on {cuda or 'the CPU'}"
        " (a CPU run on a GPU machine has no suffix)"
    )


def test_results_has_one_section_per_recording_script_and_names_every_record():
    text = RESULTS.read_text()
    sections = re.findall(r"^## (\S+\.py)$", text, re.M)
    assert len(sections) == len(set(sections)), "a script has two sections in RESULTS.md"
    recording = [s for s in SCRIPTS if re.search(r"\brecord\(", (BENCHMARKS / f"{s}.py").read_text())]
    assert recording, "no script calls record(): the check reads nothing"
    missing = [f"{s}.py" for s in recording if f"{s}.py" not in sections]
    assert not missing, f"scripts that record but have no '## <script>.py' section in RESULTS.md: {missing}"
    unknown = [s for s in sections if s[:-3] not in SCRIPTS]
    assert not unknown, f"RESULTS.md has sections for scripts that do not exist: {unknown}"
    unnamed = [r for r in RECORDS if f"`{r}`" not in text]
    assert not unnamed, f"records that RESULTS.md does not name: {unnamed}"


def test_results_keeps_no_superseded_or_dated_section():
    headings = re.findall(r"^#+ .*$", RESULTS.read_text(), re.M)
    stale = [h for h in headings if re.search(r"supersed|earlier|before|\b20\d\d-\d\d-\d\d\b", h, re.I)]
    assert not stale, f"history belongs to git, not to RESULTS.md's headings: {stale}"
    assert "supersed" not in RESULTS.read_text().lower()
