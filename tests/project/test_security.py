"""What docs/security.md promises about code from elsewhere: the package never sets ``trust_remote_code``.

A Hub repository's own Python runs only when a loader is told ``trust_remote_code=True``. No line of the package
says so (the source, read as text and as Python), and the loaders the package calls with a hub name or folder are
called without it (run with the loaders replaced by recorders: no download, no model).
"""

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted((REPO / "layerwise").rglob("*.py"))


def test_no_line_of_the_package_names_trust_remote_code():
    named = [
        f"{path.relative_to(REPO)}:{number}"
        for path in SOURCES
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"trust_remote_code", line)
    ]
    assert named == []


def test_no_call_of_the_package_passes_trust_remote_code_by_keyword_or_in_a_dict():
    """The same, read as Python: no ``f(trust_remote_code=...)``, no ``{"trust_remote_code": ...}`` spread into one."""
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            keys = []
            if isinstance(node, ast.Call):
                keys = [keyword.arg for keyword in node.keywords]
            elif isinstance(node, ast.Dict):
                keys = [key.value for key in node.keys if isinstance(key, ast.Constant)]
            if "trust_remote_code" in keys:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []
    assert len(SOURCES) > 50  # the package's source was read


class Recorded(OSError):
    """What the recorders raise once they have the call's keywords: nothing is downloaded."""


@pytest.fixture
def recorded_loaders(monkeypatch):
    """``from_pretrained`` of transformers' Auto classes replaced by recorders of their keyword arguments."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    calls: list[dict] = []

    def recorder(cls, *args, **kwargs):
        calls.append({"class": cls.__name__, **kwargs})
        raise Recorded(f"{cls.__name__}.from_pretrained recorded")

    autos = [getattr(transformers, name) for name in dir(transformers) if name.startswith("AutoModel")]
    for owner in (_BaseAutoModelClass, *autos, transformers.AutoConfig, transformers.AutoTokenizer):
        monkeypatch.setattr(owner, "from_pretrained", classmethod(recorder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return calls


def test_the_package_loads_hub_models_configs_and_tokenizers_without_trust_remote_code(recorded_loaders):
    from transformers import AutoModel, AutoModelForCausalLM

    from layerwise.datamodules.tokenizers import load_tokenizer
    from layerwise.features.hf import build_model

    for auto_class in (AutoModel, AutoModelForCausalLM):
        for pretrained in (True, False):
            with pytest.raises(ValueError, match="could not be loaded"):
                build_model(auto_class, "someone/remote-code-model", None, pretrained, None, "model")
    with pytest.raises(ValueError):
        load_tokenizer("someone/remote-code-model")
    classes = {call["class"] for call in recorded_loaders}
    assert {"AutoModel", "AutoModelForCausalLM", "AutoConfig", "AutoTokenizer"} <= classes
    assert [call for call in recorded_loaders if call.get("trust_remote_code")] == []
