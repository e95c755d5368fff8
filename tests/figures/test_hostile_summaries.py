"""A results file is data: summaries edited as a stranger could edit them, read by every reader of a summary.

The corpus (:func:`corpus`, more than 30 files, generated here): wrong types, missing keys, huge arrays, NaN/inf as
strings, deep nesting, markup and script in every string field, and figure functions named after ``os``,
``subprocess``, ``builtins`` and a module of the stranger's. Every reader — ``plot``, ``report``, ``sweep`` and the
runs side by side (``plot RUN RUN``, ``report RUN RUN``), each through the command line's entry — draws or ends with
one clear line (no traceback); no module outside the drawing's own libraries is imported across the reads; nothing is
written outside the output folder; no named function runs (each would leave a canary file).
"""

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Union

import pytest

from layerwise import __version__
from layerwise.cli import main
from layerwise.results import FIGURE_FUNCTIONS, SummaryError, check_summary, load_summary

SCRIPT = '<img src=x onerror="document.title=\'pwned\'"><script>document.title="pwned"</script>'
STRANGER = "hostile_canary_module"  # a module the stranger hopes is on the path: importing it writes a canary file
NEVER_IMPORTED = (STRANGER, "antigravity", "this", "webbrowser", "turtle", "smtplib", "gone_module")
# what drawing a figure may import the first time a kind of figure is drawn
DRAWING = ("matplotlib", "mpl_toolkits", "PIL", "numpy", "scipy", "fontTools", "kiwisolver", "pyparsing", "cycler")
GOOD_FUNCTIONS = {
    "layerwise.figures.summary:similarity_figures": None,
    "layerwise.figures.summary:logit_lens_figures": None,
    "layerwise.figures.summary:effective_depth_figures": None,
}


def base() -> dict[str, Any]:
    """A small valid summary: 3 layers, the per-layer keys, early exit (for sweep), the package's figure functions."""
    return {
        "run_id": "r1",
        "layerwise_version": __version__,
        FIGURE_FUNCTIONS: dict(GOOD_FUNCTIONS),
        "stage": "val",
        "split": "validation",
        "epoch": 0,
        "global_step": 1,
        "num_samples": 10,
        "depth": 3,
        "layers": [1, 2, 3],
        "cos": [[1.0, 0.5, 0.2], [0.5, 1.0, 0.6], [0.2, 0.6, 1.0]],
        "accuracy": [0.2, 0.5, 0.9],
        "loss": [2.0, 1.0, 0.5],
        "saturation_counts": [1, 2, 7],
        "saturation_cos": [0.4, 0.7, 1.0],
        "effective_depth": {"0.05": 3, "0.2": 2},
        "early_exit": [{"threshold": 0.5, "accuracy": 0.8, "exit_counts": [2, 3, 5], "speedup": 1.4}],
        "n_nonfinite": 0,
    }


def changed(**keys: Any) -> dict[str, Any]:
    summary = base()
    for key, value in keys.items():
        if value is DROP:
            summary.pop(key)
        else:
            summary[key] = value
    return summary


DROP = object()


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def scripted(value: Any) -> Any:
    """Every string value of ``value`` with the script canary, and a user's analysis whose keys are scripts too."""
    if isinstance(value, str):
        return value + SCRIPT
    if isinstance(value, list):
        return [scripted(item) for item in value]
    if isinstance(value, dict):
        return {key: scripted(item) for key, item in value.items()}
    return value


def script_everywhere() -> dict[str, Any]:
    summary = scripted(with_residual_and_compare())
    summary["mine"] = {SCRIPT: [SCRIPT, {SCRIPT: SCRIPT}]}
    summary[FIGURE_FUNCTIONS] = {**GOOD_FUNCTIONS, SCRIPT: "mine"}
    return summary


def with_residual_and_compare() -> dict[str, Any]:
    summary = base()
    summary["residual_norm_ratio"] = {
        "branches": ["block", "attention"],
        "layers": [1, 2, 3],
        "token": "cls",
        "pooling": "cls",
        "num_samples": 10,
        "mean": [[1.0, 2.0, 3.0], [1.5, 2.5, 3.5]],
        "quantile_levels": [0.25, 0.5, 0.75],
        "quantiles": [[[0.5, 1.0, 1.5]] * 3, [[0.6, 1.1, 1.6]] * 3],
    }
    summary["compare"] = {"model_b": "b.ckpt", "layers_a": [1, 2], "layers_b": [1, 2, 3], "cka": [[1, 0.5, 0.2]] * 2}
    summary[FIGURE_FUNCTIONS].update(
        {"layerwise.figures.summary:residual_figures": "residual_norm_ratio"}
        | {"layerwise.figures.summary:compare_figures": "compare"}
    )
    return summary


def corpus(canary: Path) -> dict[str, Union[dict, list, str, bytes]]:
    """The hostile files by name: a JSON value, or the raw text/bytes of the file."""
    shell = f"touch {canary}"
    python = f"open({str(canary)!r}, 'w').write('ran')"
    ragged_exits = base()["early_exit"] + [{"threshold": 0.9, "accuracy": 0.9, "exit_counts": [1, 2], "speedup": 1.0}]
    user_deep = changed(mine=nested(40))
    residual = with_residual_and_compare()
    residual["residual_norm_ratio"]["quantile_levels"] = [0.1, 0.9, 0.95]
    compare = with_residual_and_compare()
    compare["compare"]["cka"] = [[1.0, 0.5]]
    measures = with_residual_and_compare()
    measures["compare"]["measures"] = {"cca": [[SCRIPT, 0.5, 0.2]] * 2}  # CrossModelComparison(measures=...)
    files: dict[str, Union[dict, list, str, bytes]] = {
        # wrong types
        "layers_a_string": changed(layers="1,2,3"),
        "layers_of_strings": changed(layers=["1", "2", "3"]),
        "layers_negative": changed(layers=[-1, 0, 1]),
        "accuracy_of_markup": changed(accuracy=[SCRIPT, SCRIPT, SCRIPT]),
        "accuracy_of_booleans": changed(accuracy=[True, False, True]),
        "cos_ragged": changed(cos=[[1.0, 0.5, 0.2], [0.5, 1.0], [0.2, 0.6, 1.0]]),
        "cos_of_objects": changed(cos=[{"a": 1}, {"b": 2}, {"c": 3}]),
        "epoch_a_string": changed(epoch="3"),
        "global_step_negative": changed(global_step=-5),
        "early_exit_an_object": changed(early_exit={"threshold": 0.5}),
        "early_exit_without_threshold": changed(early_exit=[{"accuracy": 0.8, "exit_counts": [1, 2, 3]}]),
        "early_exit_ragged": changed(early_exit=ragged_exits),
        "effective_depth_markup_key": changed(effective_depth={SCRIPT: 3}),
        "effective_depth_string_value": changed(effective_depth={"0.05": "3"}),
        "figure_functions_a_list": changed(figure_functions=["os:system"]),
        "figure_functions_key_a_number": changed(figure_functions={"os:system": 5}),
        "version_a_number": changed(layerwise_version=2),
        "a_list": [base()],
        "a_string": json.dumps(SCRIPT),
        "not_json": "{'layers': [1, 2, 3], " + SCRIPT,
        "not_utf8": b"\xff\xfe{\x00\x80",
        "empty": "",
        # missing keys
        "cos_without_layers": changed(layers=DROP),
        "quantiles_without_levels": changed(cos_quantiles=[[[0.1, 0.5, 0.9]] * 3] * 3),
        "coupling_without_matrices": changed(coupling={"ks": [1], "coupling_score": [0.1], "num_prompts": 2}),
        "residual_without_the_median": residual,
        "compare_cka_of_the_wrong_shape": compare,
        "compare_measure_of_markup": measures,
        # huge arrays
        "layers_beyond_any_model": changed(layers=list(range(1, 100_001))),
        "accuracy_of_a_million_layers": changed(accuracy=[0.5] * 1_000_000),
        "cos_of_a_million_rows": changed(cos=[[0.5]] * 1_000_000),
        "huge_integers": changed(accuracy=[10**400, 1, 2]),
        "a_huge_user_key": changed(mine=list(range(300_000))),
        # NaN and inf
        "nan_strings": changed(accuracy=["NaN", "inf", "-Infinity"]),
        "nan_literals": '{"layers": [1, 2], "accuracy": [NaN, Infinity], "loss": [-Infinity, 1e999]}',
        # deep nesting
        "nested_past_the_parser": '{"layers": [1], "mine": ' + "[" * 200_000 + "]" * 200_000 + "}",
        "nested_in_a_user_key": user_deep,
        "nested_in_cos": changed(cos=nested(50)),
        # markup and script in every string field
        "script_everywhere": script_everywhere(),
        "mathtext_everywhere": changed(stage="val $\\frac{$", split="$^^$", mine={"$\\x{": "$\\undefined{x}$"}),
        # figure functions of os, subprocess, builtins, a stranger's module
        "os_system": changed(figure_functions={**GOOD_FUNCTIONS, "os:system": "note"}, note=shell),
        "os_popen_and_exec": changed(
            figure_functions={**GOOD_FUNCTIONS, "os:popen": "note", "os:execvp": "note"}, note=shell
        ),
        "subprocess": changed(
            figure_functions={
                **GOOD_FUNCTIONS,
                "subprocess:run": "argv",
                "subprocess:Popen": "argv",
                "subprocess:check_output": "argv",
            },
            argv=["touch", str(canary)],
        ),
        "builtins": changed(
            figure_functions={
                **GOOD_FUNCTIONS,
                "builtins:eval": "code",
                "builtins:exec": "code",
                "builtins:__import__": "module",
            },
            code=python,
            module=STRANGER,
        ),
        "a_strangers_module": changed(
            figure_functions={**GOOD_FUNCTIONS, f"{STRANGER}:draw": None, "gone_module:draw": "x"}, x=[1]
        ),
        "stdlib_modules_with_effects": changed(
            figure_functions={**GOOD_FUNCTIONS, "antigravity:geohash": None, "this:s": None, "webbrowser:open": "url"},
            url=str(canary),
        ),
        "the_packages_own_non_figures": changed(
            figure_functions={
                **GOOD_FUNCTIONS,
                "layerwise.figures.registry:typed_functions": "names",
                "layerwise.results:write_text_atomic": "names",
                "layerwise.figures.summary:detection_figures": "cos",  # a package figure, told to read another key
            },
            names=[f"{STRANGER}:draw"],
        ),
        "pickle_and_shutil": changed(
            figure_functions={**GOOD_FUNCTIONS, "pickle:loads": "blob", "shutil:rmtree": "folder"},
            blob="cos\nsystem\n",
            folder=".",
        ),
        # versions
        "newer_version": changed(layerwise_version="99.0.0"),
        "newer_version_that_does_not_fit": changed(layerwise_version="99.0.0", accuracy="high"),
        # configs beside the summary (written by the fixture)
        "config_not_yaml": base(),
        "config_with_a_python_tag": base(),
    }
    return files


def write(path: Path, content: Union[dict, list, str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_text(json.dumps(content), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict[str, Any]:
    """The corpus written as runs (``<root>/runs/<name>/layerwise/val_epoch_000_step_0000001.json``), and a good run."""
    root = tmp_path_factory.mktemp("hostile")
    canary = root / "canary_ran"
    (root / "path").mkdir()
    (root / "path" / f"{STRANGER}.py").write_text(f"open({str(canary)!r}, 'w').write('imported')\ndraw = print\n")
    runs = {}
    for name, content in corpus(canary).items():
        write(root / "runs" / name / "layerwise" / "val_epoch_000_step_0000001.json", content)
        runs[name] = root / "runs" / name
    # a run whose config (read by the runs side by side and the report) is not YAML, or YAML that builds an object
    (root / "runs" / "config_not_yaml" / "config.yaml").write_text("model: {class_path: [unclosed\n\t- '", "utf-8")
    (root / "runs" / "config_with_a_python_tag" / "config.yaml").write_text(
        f"model: !!python/object/apply:os.system ['touch {canary}']\n", "utf-8"
    )
    good = root / "good"
    write(good / "layerwise" / "val_epoch_000_step_0000001.json", base())
    return {"root": root, "canary": canary, "runs": runs, "good": good}


def test_the_corpus_holds_more_than_30_files_of_every_kind(hostile):
    assert len(hostile["runs"]) >= 30
    assert {"os_system", "subprocess", "builtins", "script_everywhere", "nested_past_the_parser", "nan_strings"} <= set(
        hostile["runs"]
    )


def files_under(root: Path, *besides: Path) -> dict[str, int]:
    """Every file under ``root`` (not under ``besides``) and its size."""
    return {
        str(path): path.stat().st_size
        for path in root.rglob("*")
        if path.is_file() and not any(path.is_relative_to(folder) for folder in besides)
    }


READERS = {
    "plot": lambda run, good, out: (
        ["plot", str(run / "layerwise" / "val_epoch_000_step_0000001.json"), "--out", str(out)]
        + ["--format", "png", "--width", "column"]
    ),
    "report": lambda run, good, out: ["report", str(run), "--out", str(out / "report.html"), "--width", "column"],
    "sweep": lambda run, good, out: (
        ["sweep", str(run / "layerwise" / "val_epoch_000_step_0000001.json"), "--out"] + [str(out), "--format", "png"]
    ),
    "plot_side_by_side": lambda run, good, out: (
        ["plot", str(good), str(run), "--out", str(out), "--format", "png"] + ["--width", "column"]
    ),
    "report_side_by_side": lambda run, good, out: (
        ["report", str(good), str(run), "--out", str(out / "report.html")] + ["--width", "column"]
    ),
}


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """``layerwise ARGV`` in this process (its entry, ``layerwise.cli.main``): exit code and stderr."""
    try:
        main(argv)
        code = 0
    except SystemExit as exit:
        code = int(exit.code or 0)
    return code, capsys.readouterr().err


# plot and sweep in the default run; the report and the runs side by side (10-14 s each) in the slow one (.ci/run)
@pytest.mark.parametrize(
    "reader", [name if name in ("plot", "sweep") else pytest.param(name, marks=pytest.mark.slow) for name in READERS]
)
def test_every_reader_draws_or_says_one_line_imports_nothing_and_writes_only_its_output(
    reader, hostile, tmp_path, capsys, monkeypatch
):
    monkeypatch.syspath_prepend(str(hostile["root"] / "path"))  # the stranger's module could be imported, were it named
    monkeypatch.chdir(tmp_path)
    # the drawing's own first imports (a kind of figure, a format, the entry-point metadata) before the count starts
    warm = tmp_path / "warm"
    code, _ = run_cli(READERS[reader](hostile["good"], hostile["good"], warm), capsys)
    assert code == 0
    assert run_cli(READERS[reader](hostile["runs"]["a_strangers_module"], hostile["good"], warm), capsys)[0] in (0, 2)
    before_modules = set(sys.modules)
    root = hostile["root"]
    outcomes = {}
    for name, run in hostile["runs"].items():
        out = tmp_path / "out" / name
        before = files_under(root), files_under(tmp_path, tmp_path / "out")
        code, err = run_cli(READERS[reader](run, hostile["good"], out), capsys)
        after = files_under(root), files_under(tmp_path, tmp_path / "out")
        assert after == before, f"{reader} {name}: wrote outside its output folder"
        assert "Traceback" not in err, f"{reader} {name}: {err}"
        errors = [line for line in err.splitlines() if ": error: " in line]
        if code == 0:
            assert errors == [], f"{reader} {name}: {err}"
            outcomes[name] = "drawn"
        else:
            assert code in (1, 2) and len(errors) == 1, f"{reader} {name} ({code}): {err}"
            outcomes[name] = errors[0]
        for line in err.splitlines():  # every other line: a skipped function, a newer file, where the rest is
            assert line in errors or line.startswith((f"layerwise {reader.split('_')[0]}: ", "(options: ")), line
        assert not hostile["canary"].exists(), f"{reader} {name}: a function named by the file ran"
    imported = set(sys.modules) - before_modules
    assert not {module for module in imported if module.split(".")[0] in NEVER_IMPORTED}
    assert not {module for module in imported if module.split(".")[0] not in DRAWING}, imported
    # the schema's lines name the file and the key
    if reader in ("plot", "sweep"):
        assert "val_epoch_000_step_0000001.json: `layers[0]` must be an integer" in outcomes["layers_of_strings"]
        assert "`accuracy[0]` must be a number or null, not a string" in outcomes["nan_strings"]
        assert "newer than this" in outcomes["newer_version_that_does_not_fit"]
    if reader.startswith("plot"):
        assert outcomes["os_system"] == outcomes["builtins"] == outcomes["script_everywhere"] == "drawn"


def test_an_unregistered_function_is_one_line_saying_how_to_register(hostile, tmp_path, capsys):
    run = hostile["runs"]["os_system"]
    code, err = run_cli(READERS["plot"](run, hostile["good"], tmp_path / "out"), capsys)
    assert code == 0
    (line,) = [line for line in err.splitlines() if "os:system" in line]
    assert "not registered" in line and '"layerwise.figures"' in line and "--figures" in line
    assert (tmp_path / "out" / "val_epoch_000_step_0000001_cos.png").is_file()  # the rest is drawn


def test_the_schema_reads_what_the_package_writes_and_names_the_key_of_what_it_does_not(tmp_path):
    from test_figures import synthetic_summary

    for layers in (1, 6, 24):
        assert check_summary(synthetic_summary(layers)) is not None
    with pytest.raises(SummaryError, match=r"x.json: `cos\[1\]` must be a list of 3"):
        load_summary(write(tmp_path / "x.json", changed(cos=[[1.0, 0.5, 0.2], [0.5], [0.2, 0.6, 1.0]])))
    with pytest.raises(SummaryError, match=r"`layers` must be the layer numbers"):
        load_summary(write(tmp_path / "x.json", changed(layers=DROP)))
    literal = load_summary(write(tmp_path / "n.json", '{"layers": [1, 2], "accuracy": [NaN, 1e999]}'))
    assert literal["accuracy"] == [None, None]


def test_a_summary_too_large_to_be_one_is_not_read(tmp_path, monkeypatch):
    from layerwise import results

    monkeypatch.setattr(results, "MAX_SUMMARY_BYTES", 1 << 20)
    path = write(tmp_path / "big.json", changed(mine="x" * (2 << 20)))
    with pytest.raises(SummaryError, match=r"big.json: \d+ bytes, more than a summary holds \(1 MiB\)"):
        load_summary(path)


def test_a_newer_summary_that_fits_is_drawn_and_says_so(hostile, tmp_path, capsys):
    code, err = run_cli(READERS["plot"](hostile["runs"]["newer_version"], hostile["good"], tmp_path), capsys)
    assert code == 0
    assert "written by layerwise 99.0.0, newer than this" in err


@pytest.mark.parametrize("name", ["layers_of_strings", "os_system", "nested_past_the_parser"])
def test_the_command_line_itself_answers_in_one_line(hostile, tmp_path, name):
    """The same, through ``python -m layerwise`` in a fresh process: what a user sees."""
    argv = READERS["plot"](hostile["runs"][name], hostile["good"], tmp_path / "out")
    done = subprocess.run([sys.executable, "-m", "layerwise", *argv], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in done.stderr
    assert not hostile["canary"].exists()
    if name == "os_system":
        assert done.returncode == 0 and done.stderr.count("not registered") == 1, done.stderr
    else:
        assert done.returncode == 2 and done.stderr.count("error:") == 1, done.stderr


def test_a_summary_copy_is_unchanged_by_reading():
    summary = script_everywhere()
    kept = copy.deepcopy(summary)
    check_summary(summary)
    assert summary == kept
