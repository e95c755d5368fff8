"""The command line's error style: one line naming the option and the innermost cause, exit code 2.

:func:`concise_error` cuts a jsonargparse message to the option and its innermost cause; :func:`exit_concisely`
prints that one line (the traceback only with ``LAYERWISE_DEBUG=1``) and exits with code 2 (a file that could not
be written: :func:`failed_writes_in_one_line`, code 1); :func:`class_options`
names the option of a class a constructor's error names; :func:`check_output_folders` and :func:`check_run_folder`
check a fit's folders before it starts; :func:`quiet_upstream` drops the upstream lines that say nothing about the
run. The error the rest of the package raises, :class:`~layerwise.errors.UsageError`, lives below: ``layerwise.errors``.
"""

import os
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, Optional

from layerwise.errors import DEBUG_VARIABLE, UsageError, drop_lightning_lines
from layerwise.results import WriteError

_HEADERS = ("Does not validate against any", "Subtypes:", "Errors:", "Given value", "Expected a <class 'NoneType'>")
_KEY = re.compile(r'^Parser key "([^"]+)":\s*(.*)$')
_CLASS = re.compile(r"^Problem with given class_path '([^']+)':\s*(.*)$")
_UNKNOWN_CLASS = re.compile(r"^Expected a dot import path string: (\S+)$")
# What jsonargparse says of every union member a value is not: never the cause while a real one is in the message;
# its list of the accepted forms of a class never at all, while anything else is.
_FORMS = re.compile(r"^(Subclass types expect one of:|a class path \(str\)$|a dict with|a dict without)")
_GENERIC = re.compile(r"^(Not a valid subclass of |Expected a <class )")
_GIVEN_CLASS = re.compile(r"class_path='([^']+)'")
# A key header at the end of another line: `Type ... expects a function or a callable class: Parser key "lr":`.
_TRAILING_KEY = re.compile(r'^(.*?):\s*Parser key "([^"]+)":\s*$')
_SCALAR = re.compile(r"^Expected a <class '(int|float|bool)'>$")
_NOT_ACCEPTED = re.compile(r"^Option '([^']+)' is not accepted")
_GIVEN_VALUE = re.compile(r"^Given value: (.*?)(?:\. Got value: .*)?$")


def concise_error(message: str, class_options: Optional[dict[str, str]] = None) -> str:
    """The one line of a jsonargparse error that a user needs: the option and the innermost cause.

    jsonargparse nests its message: ``Parser key "model":`` / ``Problem with given class_path '...':`` headers, each
    indented under the last, down to the cause (no such file, no such class, an option not accepted, a constructor's
    own message). The deepest line is the cause; the headers above it name the option
    (``--model.init_args.backbone``). ``class_options`` maps a class path to its option for a message without parser
    keys (a constructor's error, raised when the classes are instantiated).
    """
    lines = [line.rstrip() for line in message.splitlines() if line.strip()]
    own = [line.strip().lstrip("- ") for line in lines if "`--" in line]  # layerwise's own messages name the flag
    if own:
        return own[0]
    stack: list[tuple[int, str, str]] = []  # (indent, "key" or "class", name) of the headers above the current line
    causes: list[tuple[int, str, tuple[tuple[int, str, str], ...]]] = []
    for line in lines:
        text = line.lstrip(" -")
        indent = len(line) - len(text)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        header = _KEY.match(text) or _CLASS.match(text)
        trailing = None if header else _TRAILING_KEY.match(text)
        if header:
            stack.append((indent, "key" if header.re is _KEY else "class", header.group(1)))
            text = header.group(2)
        elif trailing:  # the key is the cause's owner; the text before it only says the outer type's form
            if "callable class" in trailing.group(1):  # a class given as a callable: the key is an init_arg
                stack.append((indent, "class", "callable"))
            stack.append((indent, "key", trailing.group(2)))
            text = ""
        if text and not text.startswith(_HEADERS):
            causes.append((indent, text, tuple(stack)))
    if not causes:
        return lines[0].strip() if lines else message
    every = causes
    causes = [cause for cause in causes if not _FORMS.match(cause[1])] or causes
    specific = [cause for cause in causes if not _GENERIC.match(cause[1])]
    causes = specific or causes
    depth = max(indent for indent, _, _ in causes)
    _, cause, path = next(cause for cause in causes if cause[0] == depth)
    if _UNKNOWN_CLASS.match(cause) or cause.startswith("Expected a path"):
        # a number option given a word (float | Tensor): the type it takes, not what a Tensor would have needed
        scalar = next((c for c in every if c[2] == path and _SCALAR.match(c[1])), None)
        given = [match.group(1) for line in lines if (match := _GIVEN_VALUE.match(line.lstrip(" -")))]
        if scalar is not None and given:
            return f"--{_option(path)[0]}: expected {_SCALAR.match(scalar[1]).group(1)}, got {given[0]!r}"
    option, last_class = _option(path)
    unknown = _UNKNOWN_CLASS.match(cause)
    if unknown:  # a short class name that matches no imported class: jsonargparse asks for an import path
        cause = f"no class named {unknown.group(1)!r}: give an existing class's name or its import path"
    if not option and last_class is None and specific:
        # a list of classes (loggers, callbacks): the one not yet instantiated in "Given value" is the one that failed
        given = [_GIVEN_CLASS.findall(line) for line in lines if line.lstrip(" -").startswith("Given value:")]
        last_class = given[-1][-1] if given and given[-1] else None
    cause += _moved(last_class, cause)
    if not option:
        option = (class_options or {}).get(last_class or "", "")
        if not option:
            return f"class_path '{last_class}': {cause}" if last_class else cause
    return f"--{option}={last_class}: {cause}" if last_class else f"--{option}: {cause}"


def _moved(class_path: Optional[str], cause: str) -> str:
    """Where an option a class no longer takes went (its ``moved_options``), for the error that refuses it."""
    refused = _NOT_ACCEPTED.match(cause)
    if not refused or not class_path:
        return ""
    module, _, name = class_path.rpartition(".")
    moved = getattr(getattr(sys.modules.get(module), name, None), "moved_options", {})  # imported: it was refused
    hint = moved.get(refused.group(1)) if isinstance(moved, dict) else None
    return f"; it moved: {hint}" if hint else ""


def _option(path: tuple[tuple[int, str, str], ...]) -> tuple[str, Optional[str]]:
    """The option the headers ``path`` name (a key after a class is its ``init_args``), and its last class if any."""
    option, last_class = "", None
    for _, kind, name in path:
        if kind == "key":
            option = f"{option}.init_args.{name}" if last_class else f"{option}.{name}" if option else name
            last_class = None
        else:
            last_class = name
    return option, last_class


def bad_config_file(argv: Optional[list[str]] = None) -> str:
    """``--config FILE: `` for the first config file in ``argv`` that is not valid YAML, else ``""``.

    ``argv``: the arguments parsed (``LayerwiseCLI(args=...)``); default the command line.
    """
    import yaml

    argv = sys.argv[1:] if argv is None else [str(arg) for arg in argv]
    for flag, value in zip(argv, argv[1:] + [""]):
        path = value if flag in ("--config", "-c") else flag.partition("=")[2] if flag.startswith("--config=") else ""
        if path and Path(path).is_file():
            try:
                yaml.safe_load(Path(path).read_text())
            except yaml.YAMLError as error:
                mark = getattr(error, "problem_mark", None)
                where = f" (line {mark.line + 1})" if mark is not None else ""
                return f"`--config {path}` is not valid YAML{where}: "
    return ""


def exit_concisely(
    prog: str, message: str, parsed: bool = True, class_options: Optional[dict[str, str]] = None
) -> NoReturn:
    """Print the one line of ``message`` that names the option, and where the rest is; exit with code 2.

    ``parsed=False`` for a command's own error (already one sentence naming the flag): its first line as it is.
    ``class_options``: see :func:`concise_error`.
    """
    lines = [line for line in message.strip().splitlines() if line.strip()] or [message]
    sys.stderr.write(
        f"{prog}: error: {concise_error(message, class_options) if parsed else lines[0]}\n"
        f"(options: {prog} --help; the whole message: {DEBUG_VARIABLE}=1 {prog} ...)\n"
    )
    sys.exit(2)


@contextmanager
def failed_writes_in_one_line(prog: str) -> Iterator[None]:
    """A file that could not be written (:class:`~layerwise.results.WriteError`: a full disk, a vanished folder).

    One line naming the path and the cause, and exit code 1: not a mistake in the command (2), the machine's. The
    traceback with ``LAYERWISE_DEBUG=1``.
    """
    try:
        yield
    except WriteError as error:
        if os.environ.get(DEBUG_VARIABLE):
            raise
        sys.stderr.write(f"{prog}: error: {error}\n")
        sys.exit(1)


def class_options(config: Any) -> dict[str, str]:
    """Each ``class_path`` given in a parsed config -> its option (``model.init_args.backbone``, ``trainer.logger``).

    Names the flag in a constructor's error (jsonargparse names only the class there), also for a class in a list.
    """
    options: dict[str, str] = {}
    for key, value in config.items(branches=False) if config is not None else ():
        if key.endswith(".class_path") and isinstance(value, str):
            options.setdefault(value, key[: -len(".class_path")])
        elif isinstance(value, list):  # a list of classes: --trainer.logger, --trainer.callbacks
            for item in value:
                class_path = getattr(item, "class_path", None)
                if isinstance(class_path, str):
                    options.setdefault(class_path, key)
    return options


def check_output_folders(trainer: Any, run_folder: bool = False) -> None:
    """Raise a UsageError naming the option when the Trainer's or a logger's output folder lies under a file.

    ``run_folder``: also when the first logger gives the run no folder (:func:`check_run_folder`).
    """
    if run_folder:
        check_run_folder(trainer)
    folders = [("--trainer.default_root_dir", trainer.default_root_dir)]
    option = "--trainer.logger.init_args.save_dir"
    folders += [(option, logger.save_dir) for logger in trainer.loggers if logger.save_dir]
    for option, folder in folders:
        if "://" in str(folder):  # a remote folder: fsspec's to check
            continue
        for part in (Path(folder), *Path(folder).parents):
            if part.exists():
                if not part.is_dir():
                    raise UsageError(f"`{option}={folder}`: {part} is a file, not a folder.")
                break


def check_run_folder(trainer: Any) -> None:
    """Raise a UsageError when the first logger gives the run no folder (Lightning's ``trainer.log_dir`` is None).

    Lightning takes the run folder from the first logger: a TensorBoard or CSV logger's ``log_dir``, any other's
    ``save_dir``, which MLflow on a database (``sqlite:///...``) does not have. The CLI's config.yaml would then stop
    the run with a bare ``AssertionError`` (LightningCLI's ``SaveConfigCallback``).
    """
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    first = trainer.loggers[0] if trainer.loggers else None
    if first is None or isinstance(first, (TensorBoardLogger, CSVLogger)) or first.save_dir is not None:
        return
    raise UsageError(
        f"`--trainer.logger`: the first logger, {type(first).__name__}, gives the run no folder (its save_dir is "
        "None), where config.yaml, the checkpoints and the summaries go: put a TensorBoardLogger or CSVLogger first."
    )


# Lightning's lines a layerwise user must otherwise learn to ignore (the commands only, not the library).
UPSTREAM_NOISE = ("💡 Tip:", "GPU available:", "TPU available:", "HPU available:")


def quiet_upstream() -> None:
    """Silence upstream noise that says nothing about the run, each case named here.

    - Lightning's advertisement for its cloud logger and its accelerator inventory (logging, INFO).
    - ``isinstance(treespec, LeafSpec)`` is deprecated: Lightning 2.6's own use of torch's pytree, harmless, fixed
      upstream in later releases.
    (Lightning's advice to sync the callbacks' already-global values is withheld per key where they are logged:
    ``layerwise._compat.already_reduced``.)
    """
    drop_lightning_lines(*UPSTREAM_NOISE)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")
