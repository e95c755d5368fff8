"""The guide's table of common options (docs/callbacks.md) is true: each callback takes what its row lists, refuses
the rest, and no error of a callback suggests an option it refuses."""

import re
from pathlib import Path

import pytest
from torch import nn

import layerwise.callbacks as callbacks
from layerwise.errors import UsageError

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "callbacks.md"
VALID = {  # a valid value of each common option, other than its default
    "every_n_epochs": 2,
    "log_figures": False,
    "figures_every_n_epochs": 3,
    "layers": [0, -1],
    "save_features": True,
    "print_table": False,
    "source": "hooks",
    "token_stride": 2,
    "blocks": "model.blocks",
    "final_norm": "model.norm",
    "classifier": "model.head",
    "pooling": "cls",
}
REQUIRED = {"CrossModelComparison": {"model_b": "gpt2"}}  # its own required argument (nothing loaded until setup)


def table() -> dict[str, set[str]]:
    """The guide's rows: callback name -> the common options its row lists."""
    text = GUIDE.read_text()
    section = text[text.index("| callbacks | common options they take |") :].split("\n\n")[0]
    rows = {}
    for line in section.splitlines()[2:]:
        names, options = line.strip("|").split("|")
        for name in re.findall(r"`(\w+)`", names):
            rows[name] = set(re.findall(r"`(\w+)`", options))
    return rows


def test_the_table_names_every_analysis_callback_and_only_known_options():
    rows = table()
    analysis = {
        name
        for name in callbacks.__all__
        if issubclass(getattr(callbacks, name), callbacks.AnalysisCallback)
        and name not in ("AnalysisCallback", "LayerwiseMonitor")
    }
    assert set(rows) == analysis
    assert set().union(*rows.values()) == set(VALID)


CASES = [(name, option) for name, options in table().items() for option in VALID]


@pytest.mark.parametrize("name, option", CASES, ids=[f"{name}-{option}" for name, option in CASES])
def test_each_callback_takes_the_options_its_row_lists_and_refuses_the_others(name, option):
    cls = getattr(callbacks, name)
    arguments = {**REQUIRED.get(name, {}), option: VALID[option]}
    if option in table()[name]:
        built = cls(**arguments)
        assert built is not None
    else:
        with pytest.raises(TypeError, match=option):
            cls(**arguments)


class Plain(nn.Module):  # a model of no known family
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))


# the callbacks without paths of their own that look for the model in setup (DetectionLayerAP reads DETR's outputs)
PATHLESS = [name for name, options in table().items() if "blocks" not in options and name != "DetectionLayerAP"]


@pytest.mark.parametrize("name", PATHLESS)
def test_an_error_never_suggests_an_option_the_callback_refuses(name):
    callback = getattr(callbacks, name)(**REQUIRED.get(name, {}))
    refused = set(VALID) - table()[name]
    with pytest.raises(UsageError, match="no model of a known family") as error:
        callback.setup(None, Plain(), "validate")  # type: ignore[arg-type]
    assert not [option for option in refused if re.search(rf"\b{option}=", str(error.value))], str(error.value)
