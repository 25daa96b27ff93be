#!/usr/bin/env bash
# The checks a lent GPU gets, in one call (a loan is 15 minutes, start included): correctness
# first, then the host-overhead and stacked-runs benchmarks that docs/performance.md reports.
# Run from the repository root on the GPU machine; results go to $OUT (default: ./gpu_out).
# Python packages the machine lacks (pydantic and its needs) travel as wheels in .whl/
# (see the device tool's README); without .whl/ the machine's own packages are used.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, fednorm; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 1
step() {  # step SECONDS NAME COMMAND...: one check, bounded, timed, its output kept in $OUT
    local limit=$1 name=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    echo "== $name: exit ${PIPESTATUS[0]}, $((SECONDS - t0)) s"
}
# 1. Every method on the GPU against the CPU, float64, both executors.
step 150 device_check python3 benchmarks/device_check.py --json "$OUT/device_check.json"
# 2. The host's share of a stacked round, on the GPU.
step 100 host_overhead python3 benchmarks/host_overhead.py --runs 10 --rounds 3 --repeats 3 --device cuda \
    --out "$OUT/host_overhead_gpu.json"
# 3. Stacked runs against one after another (HBN Table 1's setting on random CIFAR-10-shaped images).
step 110 stacked_bn10 python3 benchmarks/stacked_runs.py --synthetic --runs 10 --rounds 1 --repeats 3 --device cuda \
    --out "$OUT/stacked_bn10.json"
step 80 stacked_hbn6 python3 benchmarks/stacked_runs.py --synthetic --runs 6 --rounds 1 --repeats 2 --method hbn --norm hbn \
    --device cuda --out "$OUT/stacked_hbn6.json"
step 110 stacked_bn30 python3 benchmarks/stacked_runs.py --synthetic --runs 30 --rounds 1 --repeats 1 --device cuda \
    --out "$OUT/stacked_bn30.json"
