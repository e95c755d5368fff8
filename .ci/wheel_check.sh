#!/usr/bin/env bash
# The release as a user gets it: the wheel in dist/ installed into a fresh virtual environment outside the repository
# (with [vision]: the quickstart's backbone is a timm ViT), the shipped quickstart run by name, cut to 1 epoch of 2
# training batches, then `layerwise report` on its run folder. Called by .ci/run after `python -m build`.
set -euo pipefail
wheel=$(ls "$(cd "$(dirname "$0")/.." && pwd)"/dist/layerwise-*-py3-none-any.whl)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
unset PYTHONPATH

python3 -m venv venv
SECONDS=0
venv/bin/pip install --quiet "$wheel[vision]"
echo "wheel_check: $(basename "$wheel")[vision] installed in $SECONDS s"
venv/bin/python -c "import layerwise, sys; assert layerwise.__file__.startswith(sys.prefix), layerwise.__file__"

venv/bin/layerwise --version
test "$(venv/bin/layerwise configs | wc -l)" -gt 50  # every shipped config, one line each, and the count
SECONDS=0
venv/bin/layerwise fit --config quickstart --trainer.max_epochs=1 --trainer.limit_train_batches=2
venv/bin/layerwise report runs/quickstart/version_0
test -s runs/quickstart/version_0/report.html
echo "wheel_check: fit --config quickstart and report in $SECONDS s, outside the repository ($work)"
