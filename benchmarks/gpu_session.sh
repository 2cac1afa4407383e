#!/usr/bin/env bash
# The GPU measurements the open issues ask for (#28: CUDA tests, calibrate, cuda_plans,
# head-to-head; #31: the offloading CUDA tests and cuda_offload), on a lent GPU machine (the
# device tool), in priority order, each under its own time limit. A device call runs at most
# 10 minutes, so run it as separate calls (about 9, 6 and 5 minutes at most; less in
# practice), as far as the session's device time goes:
#
#     bash benchmarks/gpu_session.sh tests calibrate plans     # from the repository root
#     bash benchmarks/gpu_session.sh head-to-head
#     bash benchmarks/gpu_session.sh offload
#
# With no argument it runs every step. It uses that machine's python3 (PyTorch,
# transformers, typer, pandas, pytest are there) and installs this checkout into it without
# fetching anything. The reports land in reports/benchmarks/ as the scripts write them; they,
# the logs, the calibrated spec and one summary line per step are copied to $OUT (the device
# tool brings $OUT back).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
OUT="${OUT:-/tmp/gpu-session}"
mkdir -p "$OUT"

step() {  # step NAME SECONDS COMMAND...: run it, log it, say how it ended
    local name=$1 limit=$2
    shift 2
    local started=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local code=$?
    echo "$name: exit $code in $((SECONDS - started)) s" | tee -a "$OUT/summary.txt"
}

wanted() { [ $# -eq 0 ] || [[ " $STEPS " == *" $1 "* ]]; }
STEPS="$*"

# planner.cli lives in cli/ (pyproject's package-dir): an editable install maps it.
step install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
python3 -c "import planner.cli.main" 2>/dev/null || ln -sfn ../cli planner/cli
python3 -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())" | tee -a "$OUT/summary.txt"

if [ -z "$STEPS" ] || wanted tests; then
    step cuda-tests 150 python3 -m pytest -q -m cuda -p no:cacheprovider -n 0 tests
fi
if [ -z "$STEPS" ] || wanted calibrate; then
    step calibrate 90 python3 -m planner.cli.main calibrate --device cuda -o "$OUT/calibrated-gpu.json"
fi
if [ -z "$STEPS" ] || wanted plans; then
    step cuda-plans 270 python3 benchmarks/cuda_plans.py --repeats 10
fi
if [ -z "$STEPS" ] || wanted head-to-head; then
    step head-to-head 330 python3 benchmarks/cuda_head_to_head.py --repeats 10
fi
if [ -z "$STEPS" ] || wanted offload; then
    step offload 300 python3 benchmarks/cuda_offload.py --repeats 10
fi

cp reports/benchmarks/cuda_plans.* reports/benchmarks/cuda_head_to_head.md \
    reports/benchmarks/cuda_offload.md "$OUT"/ 2>/dev/null
echo "done; logs and reports in $OUT" | tee -a "$OUT/summary.txt"
