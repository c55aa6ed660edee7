#!/usr/bin/env bash
# The GPU machine's runs, one stage per argument, each with its own time limit so that one hang cannot eat
# the others. From the checkout, after cuML is installed (../shared/gpu/README.md):
#
#   bash benchmarks/on_gpu.sh setup                                # installs, then copies the suite to /tmp/run
#   bash benchmarks/on_gpu.sh tests table grid users overhead dask accel gpus
#
# Every stage but setup runs in /tmp/run, beside the installed package. Logs and JSON go to $OUT
# (default: benchmarks/results/gpu-<model>, e.g. gpu-h200).
set -u
model=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | awk '{print tolower($NF)}')
OUT=$(realpath -m "${OUT:-benchmarks/results/gpu-$model}")
mkdir -p "$OUT"
HERE=$(pwd)
export PYTHONPATH=/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}
export SKLEARN_GPU_BRIDGE_TEST_BACKEND=cuml
PYTEST=(python3 -m pytest -p no:cacheprovider -o addopts= --timeout 240 -q -rfEs --tb=short)
gpus=$(nvidia-smi -L | wc -l)

step() {  # step SECONDS LOG COMMAND...: run in /tmp/run, append its output to $OUT/LOG, say how it ended
  local seconds=$1 log=$OUT/$2
  shift 2
  echo "### $* (limit ${seconds}s)" >> "$log"
  (cd "${WHERE:-/tmp/run}" && timeout "$seconds" "$@") >> "$log" 2>&1
  echo "### exit $?" >> "$log"
  tail -n 3 "$log"
}

for stage in "$@"; do
  case $stage in
    setup)  # this checkout installed beside cuML, a client site without cuML, /tmp/run
      WHERE=$HERE step 300 setup.txt bash benchmarks/gpu_setup.sh ;;
    tests)  # the test suite against a cuML worker; accel's tests from a client without cuML. The layout
      # and docs tests read the checkout's source, which /tmp/run does not hold: CI runs them
      step 1500 pytest-cuml.txt env SKLEARN_GPU_BRIDGE_TEST_CLIENT_PATH=/tmp/client-site \
        "${PYTEST[@]}" -m "not slow" --ignore tests/test_layout.py --ignore tests/test_docs.py tests ;;
    table)  # the README's table: every case three ways, the small ones after gc.collect() and as timeit times
      step 900 e2e-table.txt python3 benchmarks/e2e.py --parts cases --out "$OUT/e2e-table.json" ;;
    grid)  # GridSearchCV with n_jobs 1, 4, -1 against scikit-learn and cuML; accuracies; worker memory
      step 600 e2e-grid.txt python3 benchmarks/e2e.py --parts grid,accuracy,memory --out "$OUT/e2e-grid.json" ;;
    users)  # as users meet it: fresh scripts' first fit, one search in a fresh process; the frames path
      step 900 e2e-users.txt python3 benchmarks/e2e.py --parts users --out "$OUT/e2e-users.json"
      for cache in off on; do
        step 300 e2e-frames.txt python3 benchmarks/e2e.py --parts cases --only "10000x1280|1M x 50" \
          --no-sklearn-large --transport frames --array-cache $cache --out "$OUT/e2e-frames-cache-$cache.json"
      done ;;
    gpus)  # one worker driving every GPU against the same worker on one GPU (a box of 2 or more)
      step 600 multi-gpu.txt python3 benchmarks/multi_gpu.py --out "$OUT/multi-gpu.json" ;;
    overhead)  # per-call cost and transport throughput against the same work in process
      step 300 overhead.txt python3 benchmarks/overhead.py --backend cuml --out "$OUT/overhead.json" ;;
    dask)  # GridSearchCV over a LocalCUDACluster of 1 GPU and of all of them
      step 600 dask-grid.txt python3 benchmarks/dask_grid.py --gpus $(printf '%s\n' 1 "$gpus" | uniq) \
        --out "$OUT/dask-grid.json" ;;
    accel)  # the examples under accel, from a client without cuML, served by a background cuML worker
      step 120 accel.txt python3 -m sklearn_gpu_bridge start --backend cuml
      step 300 accel.txt env PYTHONPATH=/tmp/client-site python3 -m sklearn_gpu_bridge.accel -v \
        benchmarks/accel/sklearn_script.py
      step 120 accel.txt env PYTHONPATH=/tmp/client-site python3 -m sklearn_gpu_bridge.accel \
        benchmarks/accel/cuml_quickstart.py
      step 60 accel.txt python3 -m sklearn_gpu_bridge stop ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
