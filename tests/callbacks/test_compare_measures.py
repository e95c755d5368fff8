"""The second-moment measures across two models: the callback, ``compare_models`` and ``compare --measure``."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import read_summary, trainer
from test_compare_callback import folder_b, padded_loader  # noqa: F401 - the module's fixture
from tiny_models import decoder, tiny_config

from layerwise.callbacks import CrossModelComparison
from layerwise.features.hooks import collect_block_outputs
from layerwise.lightning_modules import Standard

sys.path.insert(0, str(Path(__file__).parents[1] / "metrics"))
import _family_reference as ref  # noqa: E402

CROSS = ["cca", "svcca", "pwcca", "procrustes", "shape", "effective_rank"]


def token_features(model):
    """(L, T, d) float64 block outputs at the real tokens of the padded loader."""
    parts = []
    for batch in padded_loader():
        outputs = collect_block_outputs(model.transformer.h, lambda batch=batch: model(**batch))
        parts.append(torch.stack([h.detach().double() for h in outputs])[:, batch["attention_mask"].bool()])
    return torch.cat(parts, 1).numpy()


def test_callback_measures_equal_numpy_on_the_token_features(tmp_path, folder_b):  # noqa: F811
    from transformers import AutoModelForCausalLM

    backbone = decoder("gpt2")
    callback = CrossModelComparison(folder_b, measures=CROSS, shape_alpha=0.2, svcca_variance=0.9, log_figures=False)
    trainer(tmp_path, [callback]).validate(Standard(backbone).double(), padded_loader(), verbose=False)
    compare = read_summary(tmp_path)["compare"]
    measures = compare["measures"]
    from layerwise.figures.summary import compare_figures

    drawn = compare_figures(compare)  # the summary's figures: the CKA and one heatmap per measure
    assert list(drawn) == ["compare_cka", *(f"compare_{name}" for name in CROSS[:-1])]
    a = token_features(backbone.model.double().eval())
    b = token_features(AutoModelForCausalLM.from_pretrained(folder_b).double().eval())
    assert a.shape[1] > a.shape[2]  # more tokens than the width: every canonical correlation is defined
    # 54 tokens against 32 + 32 dimensions: >= 11 canonical correlations are exactly 1, so the canonical directions
    # within them are arbitrary and PWCCA's weights with them (tested at 1e-10 where N > d_A + d_B, in
    # tests/metrics/test_similarity_family.py); the mean of the correlations is not affected.
    assert np.isclose(ref.canonical_correlations(a[1], b[1]), 1.0, atol=1e-9).sum() >= 2 * a.shape[2] - (a.shape[1] - 1)
    for name in [name for name in CROSS[:-1] if name != "pwcca"]:
        if name == "shape":
            expected = [[ref.shape_distance(x, y, 0.2) for y in b] for x in a]
        elif name == "svcca":
            expected = [[ref.svcca(x, y, 0.9) for y in b] for x in a]
        else:
            expected = [[ref.PAIR[name](x, y) for y in b] for x in a]
        # shape: B's last layer has covariance eigenvalues near netrep's floor 1e-7, where alpha + (1 - alpha)
        # lambda^(-1/2) amplifies the rounding of the covariance (streamed sums here, X^T X there) to 1.4e-8
        atol = 1e-7 if name == "shape" else 1e-8
        np.testing.assert_allclose(np.array(measures[name], dtype=float), expected, rtol=0, atol=atol, err_msg=name)
    np.testing.assert_allclose(measures["effective_rank_b"], [ref.effective_rank(y) for y in b], atol=1e-8)
    with pytest.raises(ValueError, match="debiased_cka is not kept across models"):
        CrossModelComparison(folder_b, measures=["debiased_cka"])


def test_compare_command_measure_flag(tmp_path):
    from transformers import AutoModelForCausalLM

    from layerwise.cli import main as cli_main

    folder = str(tmp_path / "byte_gpt2")
    AutoModelForCausalLM.from_config(tiny_config("gpt2", vocab_size=260)).save_pretrained(folder)
    text = tmp_path / "text.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(120)))
    out = tmp_path / "out"
    argv = ["compare", "--model_a", folder, "--model_b", folder, "--text", str(text), "--tokenizer", "byte"]
    argv += ["--block_size", "16", "--max_blocks", "8", "--device", "cpu", "--out", str(out)]
    cli_main([*argv, "--measure", "cca", "procrustes", "effective_rank"])
    record = json.loads((out / "compare.json").read_text())
    assert set(record["measures"]) == {"cca", "procrustes", "effective_rank_a", "effective_rank_b"}
    cca = np.array(record["measures"]["cca"], dtype=float)
    assert np.allclose(np.diag(cca), 1.0, atol=1e-6) and record["measures"]["effective_rank_a"][0] > 1
    # a heatmap per measure beside compare_cka.png, drawn from the record (as the callback's TensorBoard images)
    assert sorted(path.name for path in out.glob("*.png")) == [
        "compare_cca.png",
        "compare_cka.png",
        "compare_procrustes.png",
    ]
    assert all((out / name).stat().st_size > 1000 for name in ("compare_cca.png", "compare_procrustes.png"))
    with pytest.raises(SystemExit):  # the earlier run's files are kept unless --overwrite
        cli_main([*argv, "--measure", "cca"])
    with pytest.raises(SystemExit):
        cli_main([*argv, "--measure", "debiased_cka", "--overwrite", "true"])


def test_measure_figures_from_a_compare_summary():
    import matplotlib.pyplot as plt

    from layerwise.figures.summary import compare_figures

    cca = [[0.9, 0.5, 0.2], [0.6, 0.8, None]]  # a null: no value
    distance = [[0.1, 0.7, 1.2], [0.6, 0.2, 0.4]]
    compare = {"model_b": "b", "layers_a": [1, 2], "layers_b": [1, 2, 3], "pairs": "all", "cka": distance}
    compare["measures"] = {"cca": cca, "procrustes": distance, "effective_rank_a": [2.0, 3.0]}
    figures = compare_figures(compare)
    assert list(figures) == ["compare_cka", "compare_cca", "compare_procrustes"]
    for name, direction, reversed_map in (("cca", "higher: more similar", False), ("procrustes", "0: the same", True)):
        fig = figures[f"compare_{name}"]
        ax, bar = fig.axes[0], fig.axes[1]
        assert direction in bar.get_ylabel()
        image = ax.images[0]
        assert image.get_cmap().name.endswith("_r") == reversed_map  # a distance: near is bright
        values = np.array(compare["measures"][name], dtype=float)
        np.testing.assert_array_equal(np.ma.filled(image.get_array(), np.nan), values)
        box = ax.get_window_extent()
        assert abs(box.width / 3 - box.height / 2) < 1.0  # square cells
        texts = [text.get_text() for text in ax.texts]
        assert ("0.90" in texts) if name == "cca" else ("1.20" in texts or "1.2" in texts)
    assert figures["compare_cca"].axes[0].patch.get_hatch() == "////"  # the null cell hatched, never a 0
    assert not figures["compare_procrustes"].axes[0].patch.get_hatch()
    plt.close("all")
    # the schema reads the measures before any figure does: a grid of the wrong shape is one line naming it
    from layerwise.results import SummaryError, check_summary

    summary = {"layers": [1, 2], "compare": {**compare, "cka": [[0.5] * 3] * 2}}
    assert check_summary(summary)["compare"]["measures"]["cca"] == cca
    summary["compare"]["measures"] = {"cca": [[0.5, 0.5]] * 2}
    with pytest.raises(SummaryError, match=r"compare\.measures\.cca"):
        check_summary(summary)
