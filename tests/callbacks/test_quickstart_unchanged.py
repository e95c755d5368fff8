"""The shipped quickstart's numbers are those of the code before the analyses became plain objects over one pool.

``data/quickstart_epoch_000_bfdb46c.json``: the summary of the first validation of ``layerwise fit --config quickstart
--trainer.max_epochs 2`` written by main at bfdb46c (its run id dropped). The same epoch now: every key equal, to the
last bit (one thread, seed 0, the same CPU operations), and keys more: ``analyses`` (what ran, with its options), the
logit lens's ``kl_to_final``/``entropy``/``final_rank`` (issue 51) and ``effective_depth_reached`` (issue 52).
"""

import json
from pathlib import Path

from helpers import read_summary

from layerwise.cli import LayerwiseCLI
from layerwise.results import FIGURE_FUNCTIONS

ROOT = Path(__file__).resolve().parents[2]
BEFORE = Path(__file__).parent / "data" / "quickstart_epoch_000_bfdb46c.json"


def test_the_quickstart_summary_equals_the_one_before_the_pool_key_for_key(tmp_path):
    LayerwiseCLI(
        args=[
            "fit",
            "--config",
            str(ROOT / "configs" / "quickstart.yaml"),
            "--trainer.max_epochs=1",  # the learning-rate schedule is the config's own (40 epochs): epoch 0 is the same
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
        ]
    )
    before = json.loads(BEFORE.read_text())
    now = read_summary(tmp_path / "quickstart" / "version_0")
    # more keys: the run id, what ran (issue 49), the logit lens's KL to the last layer, entropy and rank (issue 51)
    # and effective_depth_reached (issue 52: whether any layer reaches accuracy 1 − ε)
    added = {"run_id", "analyses", "kl_to_final", "entropy", "final_rank", "effective_depth_reached"}
    assert set(now) - set(before) == added
    assert not set(before) - set(now)
    changed = sorted(
        key for key in before if key not in ("layerwise_version", FIGURE_FUNCTIONS) and now[key] != before[key]
    )
    assert not changed, f"the quickstart's summary changed at {changed}"
    # the one name more: neural collapse's figure (issue 49), which draws nothing for NC1 alone
    assert now[FIGURE_FUNCTIONS] == {
        **before[FIGURE_FUNCTIONS],
        "layerwise.figures.summary:neural_collapse_figures": None,
    }
    assert list(now["analyses"]) == ["similarity", "logit_lens", "neural_collapse", "depth", "trajectory"]
    assert now["analyses"]["similarity"]["options"] == {
        "center": True,
        "cka": "exact",
        "max_buffered_samples": 65536,
        "cos_bins": 400,
        # the further measures, off (issue 50), with their options' defaults
        "measures": [],
        "pairs": "all",
        "svcca_variance": 0.99,
        "shape_alpha": 0.5,
        "rank_spectrum": "singular",
        # the neighbourhood measures' options (issue 50, point 5), unused while they are off
        "knn_k": 10,
        "knn_sample_size": 1024,
        "knn_seed": 0,
    }
