"""What each further similarity measure adds to a validation of the quickstart ViT: on by default or not?

The quickstart ViT (d=64, L=6) on the 360-image digits validation split, ``LayerSimilarityMonitor(log_figures=False)``
alone and with each of ``measures`` in turn (and all of them), every configuration once per round, in turn, medians
over ``--repeats`` rounds of the validation epoch (``benchmarks/callback_overhead.py``'s harness). A measure costing
more than 5 % of the validation is off by default (all are: see the table in ``benchmarks/RESULTS.md``).

    PYTHONPATH=. python benchmarks/similarity_overhead.py --repeats 5
"""

import argparse
import statistics

from callback_overhead import QUICKSTART_BACKBONE, Config, _model, measure
from lightning import seed_everything

from layerwise.callbacks import LayerSimilarityMonitor
from layerwise.datamodules import DigitsDataModule
from layerwise.metrics.functional_family import MEASURES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    seed_everything(0, verbose=False)
    data = DigitsDataModule(batch_size=64)
    data.setup("validate")
    loader = data.val_dataloader()
    model = _model(QUICKSTART_BACKBONE, "cpu")
    choices = [[], *([name] for name in MEASURES), list(MEASURES)]
    configs = [
        Config(
            ", ".join(names) or "COS + CKA only",
            {"similarity": LayerSimilarityMonitor(log_figures=False, measures=names)},
        )
        for names in choices
    ]
    measure(model, loader, configs, args.repeats, "cpu")
    base = statistics.median(configs[0].epochs)
    print(f"quickstart ViT, {len(loader.dataset)} samples, median of {args.repeats} rounds")
    print("| measures | validation epoch (s) | vs COS + CKA only |")
    print("|---|---|---|")
    for config in configs:
        epoch = statistics.median(config.epochs)
        print(f"| {config.name} | {epoch:.3f} | {epoch / base - 1:+.1%} |")


if __name__ == "__main__":
    main()
