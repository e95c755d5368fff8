#!/usr/bin/env bash
# The GPU rows of issue 24 in one call, for a session that is lent a GPU (the device tool: one NVIDIA H100 or H200).
# Each writes benchmarks/recorded/<name>_cuda_<gpu>.json (e.g. _cuda_h200), beside the CPU records README cites:
#   24.1  on a DeiT-S-sized ViT with the full analysis, a validation that draws <= 1.05x one that does not, and the
#         analysis against none (fed in groups, and per batch as before) -> callback_overhead_deit_s;
#         the host's time per batch, in groups and per batch -> callback_overhead_host; drawing next to a GPU
#         training loop, by a thread and by the drawing process -> callback_overhead_drawing
#   24.2  depth-wise coupling at GPT-2-small's shape (12 x 768, 64 tokens), >= 24x the authors' method -> coupling
#   24.3  cross-model CKA, precision="fast" <= 1.2x the two forwards at GPT-2-small, error <= 1e-4 -> compare_precision_tf32,
#         compare_precision_bf16_tf32 (TF32 products, as Lightning advises on such GPUs)
# The rows are independent: one that fails (or runs past its ROW_TIMEOUT seconds) is reported and the others still run;
# the script exits non-zero if any failed. On an H100 it took about 2 minutes (2026-11-26, before the 24.1 rows took
# their present form, which add ~2 minutes); on an H200 the host, DeiT-S and float32 compare rows took ~3 minutes.
#   bash benchmarks/gpu_rows.sh                 # from the repository root, in the project's environment
#   PYTHON=python3 ROW_TIMEOUT=200 bash benchmarks/gpu_rows.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
T="${ROW_TIMEOUT:-300}"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(), torch.__version__)" || exit 1
failed=()
row() {
    local name=$1; shift
    echo "=== $name: $*"
    local start=$SECONDS
    timeout "$T" "$PY" "$@" || failed+=("$name (exit $?)")
    echo "=== $name took $((SECONDS - start)) s"
}
row 24.2 benchmarks/coupling.py --device cuda --layers 12 --dim 768 --heads 12 --tokens 64 --repeats 3 --record
row 24.3 benchmarks/compare_precision.py --device cuda --batch 8 --tokens 256 --batches 48 --repeats 5 --matmul-precision high
row 24.3-bf16 benchmarks/compare_precision.py --device cuda --batch 8 --tokens 256 --batches 48 --repeats 5 --dtype bfloat16 --matmul-precision high
row 24.1-host benchmarks/callback_overhead.py --device cuda --cases host
row 24.1 benchmarks/callback_overhead.py --device cuda --cases deit_s --lean --workers 8 --num-samples 8192 --repeats 4
row 24.1-drawing benchmarks/callback_overhead.py --device cuda --cases drawing
if ((${#failed[@]})); then echo "failed: ${failed[*]}"; exit 1; fi
