#!/usr/bin/env bash
# The GPU runs behind the committed results, one stage per argument. Run on the
# GPU machine after cuML is installed (../shared/gpu/README.md), from a folder
# holding tests/, setup.cfg and benchmarks/ of this checkout, with the package
# installed: a checkout's own sklearn_gpu_bridge/ would shadow the install.
#
#   bash benchmarks/on_gpu.sh reliability conformance profile    # logs under $OUT
#   bash benchmarks/on_gpu.sh e2e grid                           # the three-way table, the workflow
#   bash benchmarks/on_gpu.sh verify                             # after a change: the cuML rows again
#
# Each step has its own time limit, so that one hang cannot eat the others.
set -u
OUT=${OUT:-benchmarks/results/gpu-h100}
mkdir -p "$OUT"
export SKLEARN_GPU_BRIDGE_TEST_BACKEND=cuml
export SKLEARN_GPU_BRIDGE_FIGURES="$OUT/figures.jsonl"
PYTEST=(python3 -m pytest -p no:cacheprovider -o addopts= --timeout 240)

step() {  # step SECONDS LOGFILE COMMAND...: run, append to the log, say how it ended
  local seconds=$1 log=$2
  shift 2
  echo "### $* (limit ${seconds}s)" >> "$log"
  timeout "$seconds" "$@" >> "$log" 2>&1
  echo "### exit $? after ${SECONDS}s of the session" >> "$log"
  tail -n 3 "$log"
}

for stage in "$@"; do
  case $stage in
    reliability)  # security over CURVE, faults (the GPU's own out-of-memory test too), the bad-input table
      log="$OUT/pytest-cuml-reliability.txt"
      step 90 "$log" "${PYTEST[@]}" -v -rA tests/test_security.py -k curve
      step 200 "$log" "${PYTEST[@]}" -v --tb=short -m "not slow" tests/test_faults.py tests/test_bad_input.py ;;
    checks)  # the bad-input table, the array cache, and every class's estimator checks (per test, -v)
      step 120 "$OUT/pytest-cuml-reliability-2.txt" "${PYTEST[@]}" -q --tb=short tests/test_bad_input.py tests/test_cache.py
      step 200 "$OUT/pytest-cuml-checks.txt" "${PYTEST[@]}" -v --tb=short tests/test_estimator_checks.py ;;
    verify)  # the array cache, the bad-input table, faults (the GPU's out-of-memory test too), the worker's life
      step 300 "$OUT/pytest-cuml-verify.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_cache.py \
        tests/test_bad_input.py tests/test_faults.py tests/test_worker.py ;;
    conformance)  # every method of every class, fitted state, and the estimator checks that failed before
      log="$OUT/pytest-cuml-conformance.txt"
      step 150 "$log" "${PYTEST[@]}" -q --tb=short tests/test_coverage.py tests/test_state.py
      step 60 "$log" env SKLEARN_GPU_BRIDGE_MEASURE=1 "${PYTEST[@]}" -q -s tests/test_state.py -k measure
      step 200 "$OUT/pytest-cuml-checks.txt" "${PYTEST[@]}" -v --tb=short tests/test_estimator_checks.py ;;
    profile)  # where the bridged time goes in the cases that missed their targets; copy threads
      log="$OUT/profile-h100.txt"
      step 150 "$log" python3 benchmarks/e2e.py --parts profile --only "1M" --out /tmp/profile.json
      step 90 "$log" env SKLEARN_GPU_BRIDGE_WORKER_PROFILE=/tmp/worker.prof \
        python3 benchmarks/e2e.py --parts profile --only "5000x20" --out /tmp/profile.json
      step 30 "$log" python3 -c "import pstats; pstats.Stats('/tmp/worker.prof').sort_stats('tottime').print_stats(25)"
      step 60 "$log" python3 benchmarks/e2e.py --parts profile --only "NearestNeighbors" --out /tmp/profile.json
      step 120 "$log" python3 benchmarks/overhead.py --backend cuml --repeats 100 --large-repeats 7 --out "$OUT/overhead-cuml-h100.json" ;;
    e2e)  # the three ways per case, accuracies, memory over 1,000 cycles
      step 590 "$OUT/e2e-h100.txt" python3 benchmarks/e2e.py --parts cases,accuracy,memory --out "$OUT/e2e-h100.json" ;;
    grid)  # the GridSearchCV workflow, and the array cache's effect on it
      step 590 "$OUT/e2e-h100-grid.txt" python3 benchmarks/e2e.py --parts grid --out "$OUT/e2e-h100-grid.json" ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
