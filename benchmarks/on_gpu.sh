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

alternate() {  # alternate NAME SECONDS CASES: e2e's cases before (BEFORE_SITE) and after, ROUNDS times (default 2),
  local name=$1 seconds=$2 cases=$3 round  # the first numbered FIRST_ROUND (default 1)
  for round in $(seq "${FIRST_ROUND:-1}" $(( ${FIRST_ROUND:-1} + ${ROUNDS:-2} - 1 ))); do
    if [ -n "${BEFORE_SITE:-}" ]; then
      step "$seconds" "$OUT/$name-before.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/e2e.py \
        --parts cases --only "$cases" --no-sklearn-large --out "$OUT/e2e-$name-before-$round.json"
    fi
    step "$seconds" "$OUT/$name-after.txt" python3 benchmarks/e2e.py --parts cases --only "$cases" \
      --no-sklearn-large --out "$OUT/e2e-$name-after-$round.json"
  done
}

in_turn() {  # in_turn NAME VARIABLE "VALUES" SECONDS E2E-ARGS...: e2e.py's cases with the environment's VARIABLE (the
  # client's and the worker it starts) at each of VALUES in turn, ROUNDS times (default 1), the first numbered
  # FIRST_ROUND (default 1), an even round taking the values the other way round; each run's intervals (intervals.py)
  local name=$1 variable=$2 values=$3 seconds=$4 round value order
  shift 4
  for round in $(seq "${FIRST_ROUND:-1}" $(( ${FIRST_ROUND:-1} + ${ROUNDS:-1} - 1 ))); do
    order=$values
    [ $(( round % 2 )) -eq 0 ] && order=$(printf '%s\n' $values | tac)
    for value in $order; do
      step "$seconds" "$OUT/$name-$value.txt" env "$variable=$value" python3 benchmarks/e2e.py --parts cases "$@" \
        --out "$OUT/e2e-$name-$value-$round.json"
      step 30 "$OUT/intervals-$name-$value.txt" python3 benchmarks/intervals.py "$OUT/e2e-$name-$value-$round.json"
    done
  done
}

slow_calls() {  # slow_calls NAME SLOW_CALLS-ARGS...: one run of slow_calls.py, into slow-calls-NAME.{txt,json}; 70 calls
  # unless the ARGS give --calls (the last one given counts)
  local name=$1
  shift
  step 100 "$OUT/slow-calls-$name.txt" python3 benchmarks/slow_calls.py --calls 70 "$@" --out "$OUT/slow-calls-$name.json"
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
    faithful)  # issue 13/16: sparse, portable forms, workflows, cuML in process, against cuML; then the checks script
      log="$OUT/pytest-cuml-faithful.txt"
      step 330 "$log" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_sparse.py tests/test_portable.py \
        tests/test_workflows.py tests/test_inprocess.py
      step 240 "$OUT/pytest-cuml-checks.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_estimator_checks.py ;;
    recheck)  # issues 13/14 after the fixes of the first runs: the faithful tests, every check, accel's tests
      step 330 "$OUT/pytest-cuml-faithful.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_sparse.py \
        tests/test_portable.py tests/test_workflows.py tests/test_inprocess.py
      step 240 "$OUT/pytest-cuml-checks.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_estimator_checks.py
      step 300 "$OUT/pytest-cuml-accel.txt" env SKLEARN_GPU_BRIDGE_TEST_CLIENT_PATH=/tmp/client-site \
        "${PYTEST[@]}" -q -rfEs --tb=short tests/test_accel.py ;;
    accel-tests)  # issue 14: accel's tests, their scripts in a client without cuML (/tmp/client-site)
      step 300 "$OUT/pytest-cuml-accel.txt" env SKLEARN_GPU_BRIDGE_TEST_CLIENT_PATH=/tmp/client-site \
        "${PYTEST[@]}" -q -rfEs --tb=short tests/test_accel.py ;;
    frames)  # issue 12: the frames path before frames were signed (/tmp/before-trust-site), with SHA-256
      # digests (/tmp/before-site), and now (BLAKE3), alternated, with this machine's cores
      for round in 1 2; do
        for tree in before-trust before now; do
          site=/tmp/$tree-site; [ "$tree" = now ] && site=
          step 150 "$OUT/overhead-frames.txt" env PYTHONPATH="$site${site:+:}$PYTHONPATH" python3 \
            benchmarks/overhead.py --backend cuml --repeats 50 --large-repeats 9 \
            --out "$OUT/overhead-cuml-$tree-$round.json"
        done
      done ;;
    mends)  # after the review's mends to the worker's portable forms: state, portable forms, estimators
      step 330 "$OUT/pytest-cuml-mends.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_portable.py \
        tests/test_state.py tests/test_estimators.py ;;
    concurrency)  # issue 15: do fits from several threads overlap on the GPU (cuML alone, then the grid)?
      step 200 "$OUT/gpu-concurrency.txt" python3 benchmarks/gpu_concurrency.py --out "$OUT/gpu-concurrency.json"
      step 300 "$OUT/grid-per-thread-stream.txt" env CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1 python3 benchmarks/e2e.py \
        --parts grid --repeats 1 --threads 4 --grid-ways "bridge|bridge n_jobs=4" --out "$OUT/e2e-grid-per-thread.json" ;;
    njobs)  # issue 15 after the default of 4 worker threads and children that follow set_config: small calls
      # before (BEFORE_SITE) and after, then the grid's n_jobs rows with the default worker (3 repeats each)
      small="StandardScaler fit_transform 5000x20|SVC(rbf) fit+predict 500x20|LogisticRegression fit+predict 5000x20"
      if [ -n "${BEFORE_SITE:-}" ]; then
        step 200 "$OUT/njobs-small-before.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/e2e.py \
          --parts cases --only "$small" --out "$OUT/e2e-small-before.json"
      fi
      step 200 "$OUT/njobs-small-after.txt" python3 benchmarks/e2e.py --parts cases --only "$small" \
        --out "$OUT/e2e-small-after.json"
      step 300 "$OUT/njobs-grid.txt" python3 benchmarks/e2e.py --parts grid --repeats 3 \
        --grid-ways "bridge|bridge n_jobs=4|bridge n_jobs=-1|cuml" --out "$OUT/e2e-grid-njobs.json" ;;
    large)  # issue 15: the large cases still above target, with scikit-learn in the same run (16 cores)
      step 400 "$OUT/large-cases.txt" python3 benchmarks/e2e.py --parts cases \
        --only "LogisticRegression fit 1M x 50 float64|KMeans(8) fit_predict 1M x 50|KNeighborsClassifier" \
        --out "$OUT/e2e-large.json" ;;
    checks13)  # the bridge against cuML in process, check by check (benchmarks/gpu_checks.py)
      step 300 "$OUT/gpu-checks.txt" python3 benchmarks/gpu_checks.py --out "$OUT/gpu-checks.json" ;;
    speed)  # issue 15: the per-call cases and the n_jobs grid, before (BEFORE_SITE) and after, in one run
      small="5000x20|500x20|float64|10000x1280|KMeans(8)|KNeighbors|NearestNeighbors"
      if [ -n "${BEFORE_SITE:-}" ]; then
        step 280 "$OUT/speed-before.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/e2e.py \
          --parts cases --only "5000x20|500x20 float64|LogisticRegression fit 1M x 50 float64" --no-sklearn-large \
          --out "$OUT/e2e-before.json"
      fi
      step 300 "$OUT/speed-after.txt" python3 benchmarks/e2e.py --parts cases --only "$small" \
        --no-sklearn-large --out "$OUT/e2e-after.json"
      step 120 "$OUT/speed-legs.txt" python3 benchmarks/e2e.py --parts profile \
        --only "StandardScaler fit_transform 5000x20 float64|LogisticRegression fit+predict 5000x20 float64" \
        --out /tmp/legs.json
      for threads in 1 4; do
        step 300 "$OUT/grid-threads-$threads.txt" python3 benchmarks/e2e.py --parts grid --repeats 1 --threads $threads \
          --grid-ways "bridge|bridge n_jobs=4|bridge n_jobs=-1|cuml" --out "$OUT/e2e-grid-threads-$threads.json"
      done ;;
    small)  # issue 15, 2026-11-24: the small cases before (BEFORE_SITE) and after, each case's ways in turn; where
      # the milliseconds go (worker_share.py: cuML's own ways, in process, bridged); the legs of one request
      small="StandardScaler fit_transform 5000x20|SVC(rbf) fit+predict 500x20|LogisticRegression fit+predict 5000x20"
      if [ -n "${BEFORE_SITE:-}" ]; then
        step 300 "$OUT/small-before.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/e2e.py \
          --parts cases --only "$small" --out "$OUT/e2e-small-before.json"
        for round in 1 2; do  # the round trips alone (echo, ping), before and after, alternated
          step 120 "$OUT/overhead-small.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/overhead.py \
            --backend cuml --transports pool --repeats 200 --large-repeats 3 --out "$OUT/overhead-before-$round.json"
          step 120 "$OUT/overhead-small.txt" python3 benchmarks/overhead.py \
            --backend cuml --transports pool --repeats 200 --large-repeats 3 --out "$OUT/overhead-after-$round.json"
        done
      fi
      step 300 "$OUT/small-after.txt" python3 benchmarks/e2e.py --parts cases --only "$small" \
        --out "$OUT/e2e-small-after.json"
      step 200 "$OUT/worker-share.txt" python3 benchmarks/worker_share.py --out "$OUT/worker-share.json"
      step 150 "$OUT/small-legs.txt" python3 benchmarks/e2e.py --parts profile \
        --only "StandardScaler fit_transform 5000x20|SVC(rbf) fit+predict 500x20|LogisticRegression fit+predict 5000x20" \
        --out /tmp/legs.json ;;
    pinning)  # issue 15, 2026-11-24 late: pool segments pinned for the GPU's DMA, NaN looked for once; the large
      # cases and two small ones before (BEFORE_SITE) and after, alternated; the legs; the cuML tests they touch
      cases="10000x1280|KMeans(8)|PCA(10)|LogisticRegression fit 1M|SVC(rbf) fit+predict 20000x20|NearestNeighbors"
      alternate pinning 300 "$cases|KNeighbors|StandardScaler fit_transform 5000x20|LogisticRegression fit+predict 5000x20" ;;
    pinning-legs)  # the same change: where the large cases' time goes now, and the cuML tests it touches
      step 150 "$OUT/pinning-legs.txt" python3 benchmarks/e2e.py --parts profile \
        --only "KMeans(8)|LogisticRegression fit 1M|NearestNeighbors" --out /tmp/legs.json
      step 300 "$OUT/pytest-cuml-pinning.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_pool.py \
        tests/test_bad_input.py tests/test_faults.py ;;
    neighbours)  # issue 15, the same evening: arrays of 4 MiB and more copied and checked on all cores (was 16 MB);
      # the neighbour cases (12.8 MB) and two that do not move, before (BEFORE_SITE) and after, alternated
      alternate neighbours 200 "NearestNeighbors|KNeighbors|10000x1280|StandardScaler fit_transform 5000x20" ;;
    settle)  # the review's mends (a request that read pinned memory waits for the device before its reply; pools
      # held until then): the cuML tests of the pool and of bad input, then cases before (BEFORE_SITE) and after
      step 200 "$OUT/pytest-cuml-settle.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_pool.py tests/test_bad_input.py
      alternate settle 200 "10000x1280|KMeans(8)|LogisticRegression fit 1M x 50|NearestNeighbors|StandardScaler fit_transform 5000x20" ;;
    slot)  # issue 15, 2026-11-25: replies read from the client's pool (reply_wait auto = spin here) against the
      # same build sleeping on the socket (reply_wait=sleep, the path before), in turn within each case; the
      # legs; the cuML tests of the reply slot and of the transport
      small="StandardScaler fit_transform 5000x20|SVC(rbf) fit+predict 500x20|LogisticRegression fit+predict 5000x20"
      step 200 "$OUT/pytest-cuml-slot.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_reply_slot.py \
        tests/test_transport.py tests/test_trust.py -k "reply or transport or measure"
      for round in $(seq "${ROUNDS:-1}"); do
        step 300 "$OUT/slot-small.txt" python3 benchmarks/e2e.py --parts cases --only "$small" \
          --bridge-variants "sleep:reply_wait=sleep" --out "$OUT/e2e-slot-small-$round.json"
      done
      step 150 "$OUT/slot-legs.txt" python3 benchmarks/e2e.py --parts profile --only "$small" --out /tmp/legs.json
      step 150 "$OUT/slot-legs.txt" env SKLEARN_GPU_BRIDGE_REPLY_WAIT=sleep python3 benchmarks/e2e.py --parts profile \
        --only "$small" --out /tmp/legs.json ;;
    slot-grid)  # the same change: the n_jobs grid with replies read from the pool (auto) and without (sleep),
      # alternated: a call spins for up to 10 ms, which must not cost the searches that run many at once
      for round in $(seq "${ROUNDS:-2}"); do
        for wait in auto sleep; do
          step 200 "$OUT/slot-grid.txt" env SKLEARN_GPU_BRIDGE_REPLY_WAIT=$wait python3 benchmarks/e2e.py --parts grid \
            --repeats 2 --grid-ways "bridge|bridge n_jobs=4|bridge n_jobs=-1" --out "$OUT/e2e-slot-grid-$wait-$round.json"
        done
      done ;;
    steps)  # issue 15, 2026-11-25 (second session): where the worker's share goes, step by step (worker_steps),
      # a cProfile of the worker's requests, cuML's own ways (worker_share.py); PCA 1M and RandomForest 200k again
      small="StandardScaler fit_transform 5000x20|SVC(rbf) fit+predict 500x20|LogisticRegression fit+predict 5000x20"
      step 150 "$OUT/steps-small.txt" python3 benchmarks/e2e.py --parts profile --only "$small" --out /tmp/legs.json
      step 120 "$OUT/steps-small.txt" env SKLEARN_GPU_BRIDGE_WORKER_PROFILE=/tmp/worker.prof python3 benchmarks/e2e.py \
        --parts profile --only "StandardScaler fit_transform 5000x20" --out /tmp/legs.json
      step 30 "$OUT/steps-small.txt" python3 -c "import pstats; s = pstats.Stats('/tmp/worker.prof'); \
        s.sort_stats('cumtime').print_stats(45); s.sort_stats('tottime').print_stats(30)"
      step 150 "$OUT/steps-small.txt" python3 benchmarks/worker_share.py --out "$OUT/worker-share.json"
      for round in 1 2; do
        step 200 "$OUT/steps-large.txt" python3 benchmarks/e2e.py --parts cases --only "PCA(10)|RandomForest" \
          --no-sklearn-large --out "$OUT/e2e-large-$round.json"
      done
      step 200 "$OUT/steps-large.txt" python3 benchmarks/e2e.py --parts profile --only "PCA(10)|RandomForest" \
        --out /tmp/legs.json ;;
    herd)  # the same session: released models freed after the reply, and the executor thread idle last woken for
      # the next request (before, every finished request woke every idle thread): the cuML tests of the scheduler,
      # handles and reply slot; the small cases before (BEFORE_SITE) and after, alternated; the steps, after and before
      small="StandardScaler fit_transform 5000x20|SVC(rbf) fit+predict 500x20|LogisticRegression fit+predict 5000x20"
      alternate herd 300 "$small"
      step 150 "$OUT/herd-legs.txt" python3 benchmarks/e2e.py --parts profile --only "$small" --out /tmp/legs.json
      step 150 "$OUT/herd-legs.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/e2e.py --parts profile \
        --only "$small" --out /tmp/legs.json ;;
    herd-tests)  # the cuML tests of the scheduler, the handles and the reply slot, after that change
      step 240 "$OUT/pytest-cuml-herd.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_scheduler.py \
        tests/test_reply_slot.py tests/test_worker.py tests/test_estimators.py ;;
    leaders-tests)  # issue 15, 2026-11-25 (third session): the cuML tests of the scheduler, the worker, the reply slot
      # and the estimators, after the threads took turns at reading (leader/followers)
      step 240 "$OUT/pytest-cuml-leaders.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_scheduler.py \
        tests/test_reply_slot.py tests/test_worker.py tests/test_estimators.py ;;
    leaders)  # the same change: the small cases before (BEFORE_SITE: the reading thread hands every request to an
      # executor) and after (the thread that read a request runs it), alternated, ROUNDS times
      small="StandardScaler fit_transform 5000x20|SVC(rbf) fit+predict 500x20|LogisticRegression fit+predict 5000x20"
      alternate leaders 300 "$small" ;;
    leaders-legs)  # the same change: the steps of the small cases after, then before
      small="StandardScaler fit_transform 5000x20|SVC(rbf) fit+predict 500x20|LogisticRegression fit+predict 5000x20"
      step 150 "$OUT/leaders-legs.txt" python3 benchmarks/e2e.py --parts profile --only "$small" --out /tmp/legs.json
      step 150 "$OUT/leaders-legs.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/e2e.py \
        --parts profile --only "$small" --out /tmp/legs.json ;;
    pca)  # target 2: PCA(10) 1M x 100 after the 51 MB case and KMeans 1M in the same worker, as the table runs it;
      # then the steps of each, and a cProfile of the worker's requests
      large="StandardScaler fit_transform 10000x1280|KMeans(8) fit_predict 1M|PCA(10) fit_transform 1M"
      step 240 "$OUT/pca.txt" python3 benchmarks/e2e.py --parts cases --only "$large" --no-sklearn-large \
        --out "$OUT/e2e-pca.json"
      step 240 "$OUT/pca.txt" env SKLEARN_GPU_BRIDGE_WORKER_PROFILE=/tmp/pca.prof python3 benchmarks/e2e.py \
        --parts profile --only "$large" --out /tmp/legs.json
      step 30 "$OUT/pca.txt" python3 -c "import pstats; s = pstats.Stats('/tmp/pca.prof'); \
        s.sort_stats('cumtime').print_stats(50); s.sort_stats('tottime').print_stats(30)" ;;
    device-copy-tests)  # the same session: a large float X copied to the device by the worker before cuML sees it
      # (CumlBackend.inputs); here every X, however small (threshold 0), so that every class and method meets it
      log="$OUT/pytest-cuml-device-copy.txt"
      step 300 "$log" env SKLEARN_GPU_BRIDGE_DEVICE_COPY_MIN_BYTES=0 "${PYTEST[@]}" -q -rfEs --tb=short \
        tests/test_coverage.py tests/test_estimators.py tests/test_worker.py ;;
    device-copy)  # the same change: the cases of 8 MiB and more before (BEFORE_SITE) and after, alternated
      large="StandardScaler fit_transform 10000x1280|KMeans(8) fit_predict 1M|PCA(10) fit_transform 1M"
      large="$large|LogisticRegression fit 1M|NearestNeighbors|KNeighborsClassifier"
      alternate device-copy 300 "$large" ;;
    slot-tests)  # issue 15, 2026-11-25 (fourth session): a request's next request read from its request slot
      # (next_slot); the cuML tests of the slots, the worker, the scheduler, the protocol and the estimators
      step 240 "$OUT/pytest-cuml-request-slot.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_reply_slot.py \
        tests/test_worker.py tests/test_scheduler.py tests/test_protocol.py tests/test_estimators.py ;;
    slot-legs)  # the same change: the steps of the small cases after, then before (BEFORE_SITE)
      small="StandardScaler fit_transform 5000x20|SVC(rbf) fit+predict 500x20|LogisticRegression fit+predict 5000x20"
      small="$small|LinearRegression fit+predict 5000x20"
      step 170 "$OUT/slot-legs-after.txt" python3 benchmarks/e2e.py --parts profile --only "$small" --out /tmp/legs.json
      step 170 "$OUT/slot-legs-before.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/e2e.py \
        --parts profile --only "$small" --out /tmp/legs.json ;;
    slot)  # the same change: the small cases before and after, alternated, ROUNDS times
      small="StandardScaler fit_transform 5000x20|SVC(rbf) fit+predict 500x20|LogisticRegression fit+predict 5000x20"
      alternate slot 280 "$small|LinearRegression fit+predict 5000x20" ;;
    lr1m)  # the same change: LogisticRegression 1M (float32, float64) and PCA 1M before and after, alternated
      alternate lr1m 100 "LogisticRegression fit 1M|PCA(10) fit_transform 1M" ;;
    short-tests)  # issue 15, 2026-11-25 (fifth session): plain arrays validated the short way on the client, the
      # header's opcodes stepped over rather than decoded on the worker; the cuML tests of bad input, the protocol
      # (and the fourth session's mends to it), the request slots and the estimators
      step 240 "$OUT/pytest-cuml-short.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_bad_input.py \
        tests/test_protocol.py tests/test_reply_slot.py tests/test_estimators.py ;;
    short)  # the same change: the small cases before (BEFORE_SITE) and after, alternated, ROUNDS times
      small="StandardScaler fit_transform 5000x20|SVC(rbf) fit+predict 500x20|LogisticRegression fit+predict 5000x20"
      alternate short 280 "$small|LinearRegression fit+predict 5000x20" ;;
    short-legs)  # the same change: the steps of the small cases after, then before (BEFORE_SITE)
      small="StandardScaler fit_transform 5000x20|SVC(rbf) fit+predict 500x20|LogisticRegression fit+predict 5000x20"
      step 170 "$OUT/short-legs-after.txt" python3 benchmarks/e2e.py --parts profile --only "$small" --out /tmp/legs.json
      step 170 "$OUT/short-legs-before.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/e2e.py \
        --parts profile --only "$small" --out /tmp/legs.json ;;
    threads)  # issue 15, 2026-11-25 (sixth session): why cuML runs slower on a worker thread than on the caller's
      # (thread_penalty.py; again with one malloc arena, and with the process on one core); the worker's own
      # profile of StandardScaler; the cuML tests of the doorbell in its final form (a datagram naming its slot)
      step 120 "$OUT/thread-penalty.txt" python3 benchmarks/thread_penalty.py --out "$OUT/thread-penalty.json"
      step 90 "$OUT/thread-penalty.txt" env MALLOC_ARENA_MAX=1 python3 benchmarks/thread_penalty.py --repeats 40
      step 90 "$OUT/thread-penalty.txt" taskset -c 3 python3 benchmarks/thread_penalty.py --repeats 40
      step 90 "$OUT/threads-legs.txt" env SKLEARN_GPU_BRIDGE_WORKER_PROFILE=/tmp/worker.prof python3 benchmarks/e2e.py \
        --parts profile --only "StandardScaler fit_transform 5000x20" --out /tmp/legs.json
      step 30 "$OUT/threads-legs.txt" python3 -c "import pstats; s = pstats.Stats('/tmp/worker.prof'); \
        s.sort_stats('tottime').print_stats(40)"
      step 150 "$OUT/pytest-cuml-bell.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_reply_slot.py \
        tests/test_protocol.py tests/test_service.py ;;
    alloc-micro)  # issue 15, sixth session: the worker's device memory from CUDA's stream-ordered pool (device_memory
      # "async") against cudaMalloc per array ("cuda", cuML's default and the worker's before): cuML in process first
      step 200 "$OUT/device-memory.txt" python3 benchmarks/device_memory.py --out "$OUT/device-memory.json" ;;
    alloc-small)  # the same: the small cases with the worker's device_memory=cuda (before) and async (after), in
      # turn, rounds ROUND_FROM..ROUND_TO
      small="StandardScaler fit_transform 5000x20|SVC(rbf) fit+predict 500x20|LogisticRegression fit+predict 5000x20"
      for round in $(seq "${ROUND_FROM:-1}" "${ROUND_TO:-1}"); do
        step 170 "$OUT/alloc-small-before.txt" env SKLEARN_GPU_BRIDGE_WORKER_DEVICE_MEMORY=cuda python3 \
          benchmarks/e2e.py --parts cases --only "$small" --no-sklearn-large --out "$OUT/e2e-alloc-small-before-$round.json"
        step 170 "$OUT/alloc-small-after.txt" python3 benchmarks/e2e.py --parts cases --only "$small" \
          --no-sklearn-large --out "$OUT/e2e-alloc-small-after-$round.json"
      done ;;
    alloc-large)  # the same: the large cases, before (cuda) and after (async), one round
      large="10000x1280|KMeans(8)|LogisticRegression fit 1M x 50"
      step 200 "$OUT/alloc-large-before.txt" env SKLEARN_GPU_BRIDGE_WORKER_DEVICE_MEMORY=cuda python3 benchmarks/e2e.py \
        --parts cases --only "$large" --no-sklearn-large --out "$OUT/e2e-alloc-large-before.json"
      step 200 "$OUT/alloc-large-after.txt" python3 benchmarks/e2e.py --parts cases --only "$large" \
        --no-sklearn-large --out "$OUT/e2e-alloc-large-after.json" ;;
    alloc-tests)  # the same: the cuML tests of faults (the GPU's out-of-memory test), the estimators, the pool
      step 300 "$OUT/pytest-cuml-alloc.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_faults.py \
        tests/test_estimators.py tests/test_pool.py tests/test_worker.py ;;
    links)  # the same session, later: a thread's link goes with its thread (fbdbfd0); the pool's cuML tests again,
      # then cuML in process under each allocator with the large cases too
      step 200 "$OUT/pytest-cuml-links.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_pool.py tests/test_worker.py
      step 250 "$OUT/device-memory-2.txt" python3 benchmarks/device_memory.py --out "$OUT/device-memory-2.json" ;;
    bell)  # the same session, later: a request slot stays armed after the watch, and the client rings the worker's
      # doorbell (then a FIFO its reader polls; now a datagram socket) when it writes there; StandardScaler (float32, float64) and the
      # LogisticRegression pair before (BEFORE_SITE) and after, one round each, then their legs after and before
      small="StandardScaler fit_transform 5000x20|LogisticRegression fit+predict 5000x20"
      ROUNDS=1 alternate bell 100 "$small"
      step 60 "$OUT/bell-legs-after.txt" python3 benchmarks/e2e.py --parts profile \
        --only "StandardScaler fit_transform 5000x20" --out /tmp/legs.json
      step 60 "$OUT/bell-legs-before.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/e2e.py \
        --parts profile --only "StandardScaler fit_transform 5000x20" --out /tmp/legs.json ;;
    gap)  # issue 15, seventh session: a small call after each kind of pause (none, gc.collect(), sleeps, numpy work),
      # through workers with watch_ms 3 and 200 (its default while this ran; 3 since), cuML in process under each
      # allocator, the workers' CPU time; then the cuML tests of the setting, the request slots and the worker
      step 300 "$OUT/idle-gap.txt" python3 benchmarks/idle_gap.py --out "$OUT/idle-gap.json"
      step 200 "$OUT/pytest-cuml-watch.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_reply_slot.py \
        tests/test_worker.py tests/test_inprocess.py ;;
    watch-before)  # the same session: the small cases with watch_ms=3 (now the default; run while 200 was, and the
      # stage "table" after it then ran with 200: results/gpu-h200-1125g/README.md)
      small="StandardScaler fit_transform 5000x20|LogisticRegression fit+predict 5000x20|SVC(rbf) fit+predict 500x20"
      step 250 "$OUT/watch-before.txt" env SKLEARN_GPU_BRIDGE_WORKER_WATCH_MS=3 python3 benchmarks/e2e.py \
        --parts cases --only "$small" --no-sklearn-large --out "$OUT/e2e-watch-before.json" ;;
    held)  # issue 15, eighth session: a request written into its slot is not sent through ZeroMQ too unless the
      # worker does not take it there, and the client rings only where no thread watches; the six small cases
      # before (BEFORE_SITE: 8ebd77a) and after, alternated, twice
      ROUNDS=2 alternate held 150 "StandardScaler fit_transform 5000x20|LogisticRegression fit+predict 5000x20|SVC(rbf) fit+predict 500x20" ;;
    held-legs)  # the same change: the legs of the small cases after and before
      small="StandardScaler fit_transform 5000x20|LogisticRegression fit+predict 5000x20|SVC(rbf) fit+predict 500x20"
      step 90 "$OUT/held-legs-after.txt" python3 benchmarks/e2e.py --parts profile --only "$small" --out /tmp/legs.json
      step 90 "$OUT/held-legs-before.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/e2e.py \
        --parts profile --only "$small" --out /tmp/legs.json ;;
    codec)  # issue 15, ninth session: headers as msgpack, not pickles; what a header costs, before and after
      step 120 "$OUT/header-codec.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/header_codec.py \
        --out "$OUT/header-codec-before.json"
      step 120 "$OUT/header-codec.txt" python3 benchmarks/header_codec.py --out "$OUT/header-codec-after.json" ;;
    msgpack)  # the same change: the six small cases before (BEFORE_SITE: 672c8de) and after, alternated, ROUNDS
      ROUNDS=${ROUNDS:-1} alternate msgpack 150 \
        "StandardScaler fit_transform 5000x20|LogisticRegression fit+predict 5000x20|SVC(rbf) fit+predict 500x20" ;;
    msgpack-legs)  # the same change: the legs of the small cases after and before
      small="StandardScaler fit_transform 5000x20|LogisticRegression fit+predict 5000x20|SVC(rbf) fit+predict 500x20"
      step 90 "$OUT/msgpack-legs-after.txt" python3 benchmarks/e2e.py --parts profile --only "$small" --out /tmp/legs.json
      step 90 "$OUT/msgpack-legs-before.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/e2e.py \
        --parts profile --only "$small" --out /tmp/legs.json ;;
    legs)  # issue 15, tenth session: the legs of the small cases, each pair's fit and predict on their own too,
      # then the worker's cProfile of the LogisticRegression pair
      small="StandardScaler fit_transform 5000x20|LogisticRegression fit+predict 5000x20|SVC(rbf) fit+predict 500x20"
      step 150 "$OUT/legs${LEGS_TAG:-}.txt" python3 benchmarks/e2e.py --parts profile --only "$small" --out /tmp/legs.json
      step 90 "$OUT/legs-worker-profile${LEGS_TAG:-}.txt" env SKLEARN_GPU_BRIDGE_WORKER_PROFILE=/tmp/worker.prof \
        python3 benchmarks/e2e.py --parts profile --only "LogisticRegression fit+predict 5000x20" --out /tmp/legs.json
      step 30 "$OUT/legs-worker-profile${LEGS_TAG:-}.txt" python3 -c \
        "import pstats; pstats.Stats('/tmp/worker.prof').sort_stats('tottime').print_stats(40)" ;;
    client-legs)  # issue 15, tenth session: the legs of the small cases (pairs split) after, then before (BEFORE_SITE)
      small="StandardScaler fit_transform 5000x20|LogisticRegression fit+predict 5000x20|SVC(rbf) fit+predict 500x20"
      step 150 "$OUT/client-legs-after.txt" python3 benchmarks/e2e.py --parts profile --only "$small" --out /tmp/legs.json
      step 150 "$OUT/client-legs-before.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/e2e.py \
        --parts profile --only "$small" --out /tmp/legs.json ;;
    client)  # the same change: the six small cases before (BEFORE_SITE: 11a7837) and after, alternated, ROUNDS
      ROUNDS=${ROUNDS:-1} alternate client 150 \
        "StandardScaler fit_transform 5000x20|LogisticRegression fit+predict 5000x20|SVC(rbf) fit+predict 500x20" ;;
    client-tests)  # the same change with the cuML worker: the protocol's, the pool's, the reply slots', the estimators'
      step 300 "$OUT/pytest-cuml-client.txt" "${PYTEST[@]}" -q -m "not slow" tests/test_protocol.py tests/test_pool.py \
        tests/test_reply_slot.py tests/test_estimators.py ;;
    heads-up-legs)  # issue 15, eleventh session: the heads-up ring; the small cases' legs after, then before (BEFORE_SITE)
      small="StandardScaler fit_transform 5000x20|LogisticRegression fit+predict 5000x20|SVC(rbf) fit+predict 500x20"
      step 150 "$OUT/heads-up-legs-after.txt" python3 benchmarks/e2e.py --parts profile --only "$small" --out /tmp/legs.json
      step 150 "$OUT/heads-up-legs-before.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/e2e.py \
        --parts profile --only "$small" --out /tmp/legs.json ;;
    heads-up)  # the same change: the six small cases before (BEFORE_SITE: be17ed8) and after, alternated, ROUNDS
      ROUNDS=${ROUNDS:-1} alternate heads-up 250 \
        "StandardScaler fit_transform 5000x20|LogisticRegression fit+predict 5000x20|SVC(rbf) fit+predict 500x20" ;;
    run-where)  # why cuML's call takes longer in the worker's "ran" step than in process (benchmarks/run_where.py)
      step 400 "$OUT/run-where.txt" python3 benchmarks/run_where.py --repeats "${REPEATS:-40}" --out "$OUT/run-where.json" ;;
    msgpack-tests)  # the same change: the protocol's, security's and the fuzzer's tests with the cuML worker
      step 300 "$OUT/pytest-cuml-msgpack.txt" "${PYTEST[@]}" -q -m "not slow" tests/test_protocol.py \
        tests/test_security.py tests/test_fuzz.py tests/test_reply_slot.py ;;
    sampled)  # issue 15, twelfth session: both processes sampled by py-spy while the small cases run after gc.collect()
      # py-spy: its wheel in .gpu-wheels/extra, installed by gpu_setup.sh into /tmp/pyspy (its binary in bin/)
      step 200 "$OUT/sampled.txt" env PATH="/tmp/pyspy/bin:$PATH" python3 benchmarks/sampled.py --backend cuml \
        --seconds "${SECONDS_EACH:-25}" \
        --only "StandardScaler fit_transform 5000x20,LogisticRegression fit+predict 5000x20" --out "$OUT/sampled.json" ;;
    finite)  # issue 15, thirteenth session: the scalers say `finite` of an X they found free of NaN; the worker's
      # cost of cuML's own look (worker_check.py), then the six small cases before (BEFORE_SITE: 9b09ed2) and after,
      # ROUNDS times (default 1: a round is about 300 s; more rounds in calls of their own, FIRST_ROUND=2 ...)
      step 200 "$OUT/worker-check.txt" python3 benchmarks/worker_check.py --backend cuml --runs 100 \
        --out "$OUT/worker-check.json"
      ROUNDS=${ROUNDS:-1} alternate finite 250 \
        "StandardScaler fit_transform 5000x20|LogisticRegression fit+predict 5000x20|SVC(rbf) fit+predict 500x20" ;;
    small-device-copy)  # the same session, run in the fourteenth (results/gpu-h200-1127b/): every float X copied to
      # the device by the worker (threshold 0) against the default (8 MiB), in turn: a small fit_transform then
      # converts X once, not in fit and transform; ROUNDS (default 1, about 300 s each) numbered from FIRST_ROUND
      small="StandardScaler fit_transform 5000x20|LogisticRegression fit+predict 5000x20|SVC(rbf) fit+predict 500x20"
      for round in $(seq "${FIRST_ROUND:-1}" $(( ${FIRST_ROUND:-1} + ${ROUNDS:-1} - 1 ))); do
        step 250 "$OUT/small-device-copy.txt" env SKLEARN_GPU_BRIDGE_DEVICE_COPY_MIN_BYTES=0 python3 benchmarks/e2e.py \
          --parts cases --only "$small" --no-sklearn-large --out "$OUT/e2e-small-device-copy-0-$round.json"
        step 250 "$OUT/small-device-copy.txt" python3 benchmarks/e2e.py --parts cases --only "$small" \
          --no-sklearn-large --out "$OUT/e2e-small-device-copy-default-$round.json"
      done ;;
    cupy-pool)  # the same session, run in the fourteenth: cuML in process with CuPy's arrays from RMM's Python
      # allocator (as cuML sets it) and from CuPy's own stream-ordered pool, under the worker's device memory, in turn
      step 250 "$OUT/device-memory-cupy-pool.txt" python3 benchmarks/device_memory.py --out "$OUT/device-memory-cupy-pool.json" ;;
    cupy-alloc)  # issue 15, fourteenth session: the worker's CuPy arrays from CuPy's own stream-ordered allocator
      # (device_memory async-cupy) against RMM's Python one (async, the default), the six small cases in turn, ROUNDS
      small="StandardScaler fit_transform 5000x20|LogisticRegression fit+predict 5000x20|SVC(rbf) fit+predict 500x20"
      for round in $(seq "${FIRST_ROUND:-1}" $(( ${FIRST_ROUND:-1} + ${ROUNDS:-1} - 1 ))); do
        step 250 "$OUT/cupy-alloc.txt" env SKLEARN_GPU_BRIDGE_WORKER_DEVICE_MEMORY=async-cupy python3 benchmarks/e2e.py \
          --parts cases --only "$small" --no-sklearn-large --out "$OUT/e2e-cupy-alloc-async-cupy-$round.json"
        step 250 "$OUT/cupy-alloc.txt" python3 benchmarks/e2e.py --parts cases --only "$small" \
          --no-sklearn-large --out "$OUT/e2e-cupy-alloc-async-$round.json"
      done ;;
    fresh-tests)  # the same session: the cuML tests of the worker's allocators and of bad input (the scalers' finite)
      step 200 "$OUT/pytest-cuml-fresh.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_bad_input.py \
        tests/test_worker.py ;;
    table)  # the README's table: every case, three ways, scikit-learn on all cores included; the small cases after
      # gc.collect()s and again as timeit times (the collector off, back to back)
      step 590 "$OUT/e2e-table.txt" python3 benchmarks/e2e.py --parts cases --between collect,timeit \
        --out "$OUT/e2e-table.json" ;;
    target1)  # issue 15, twenty-second session: the small cases of target 1 (the forest's left out), after
      # gc.collect()s and timeit's way, at least 60 rounds each (results/gpu-h200-1128b/e2e-small.*); then
      # their intervals (intervals.py)
      small="StandardScaler fit_transform 5000x20|PCA(5)|LinearRegression fit+predict|LogisticRegression fit+predict"
      small="$small|KMeans(3)|SVC(rbf) fit+predict 500x20"
      step 400 "$OUT/e2e-small.txt" python3 benchmarks/e2e.py --parts cases --between collect,timeit --repeats 60 \
        --only "$small" --out "$OUT/e2e-small.json"
      step 60 "$OUT/intervals-small.txt" python3 benchmarks/intervals.py "$OUT/e2e-small.json" ;;
    device-copy-small)  # issue 15, twenty-third session: target 1's float32 cases whose cuML class takes X in
      # column-major order (PCA, the linear models) and StandardScaler, with the worker copying every float X to
      # the device itself (DEVICE_COPY_MIN_BYTES=0) and copying only X of 8 MiB and more (8388608, the
      # threshold before), in turn (in_turn: ROUNDS, FIRST_ROUND)
      small='StandardScaler fit_transform 5000x20$|PCA(5)|LinearRegression fit+predict|LogisticRegression fit+predict 5000x20$'
      in_turn device-copy-small SKLEARN_GPU_BRIDGE_DEVICE_COPY_MIN_BYTES "0 8388608" 280 \
        --between collect,timeit --repeats 60 --only "$small" ;;
    device-copy-legs)  # the same: PCA(5)'s legs (the worker's steps: "ran" is cuML's) under each threshold
      for min_bytes in 0 8388608; do
        step 90 "$OUT/device-copy-legs-$min_bytes.txt" env SKLEARN_GPU_BRIDGE_DEVICE_COPY_MIN_BYTES=$min_bytes \
          python3 benchmarks/e2e.py --parts profile --only "PCA(5)|LinearRegression fit+predict 5000x20$" --out /tmp/legs.json
      done ;;
    between)  # issue 15, fifteenth session: the six small cases after each of e2e's BETWEEN (gc.collect(), timeit's
      # way, a pause as long as a collection), in one run; their legs after each of PROFILE_BETWEEN
      small="StandardScaler fit_transform 5000x20|LogisticRegression fit+predict 5000x20|SVC(rbf) fit+predict 500x20"
      step 450 "$OUT/between.txt" python3 benchmarks/e2e.py --parts cases --only "$small" --no-sklearn-large \
        --between collect,timeit,pause --out "$OUT/e2e-between.json"
      step 240 "$OUT/between-legs.txt" python3 benchmarks/e2e.py --parts profile --only "$small" --out /tmp/legs.json ;;
    placement)  # the same session: the machine's CPU layout; the three float32 small cases, timeit's way and after
      # gc.collect()s, with the client and its worker free to run on any core, and held on four cores that share
      # cpu0's last-level cache (taskset), alternated ROUNDS times (default 2)
      { lscpu; lscpu -e; nvidia-smi topo -m; } > "$OUT/cpu-layout.txt" 2>&1
      l3=$(cat /sys/devices/system/cpu/cpu0/cache/index3/shared_cpu_list 2>/dev/null || echo 0-3)
      cores=$(python3 -c 'import sys; c = [n for p in sys.argv[1].split(",") for lo, _, hi in [p.partition("-")]
for n in range(int(lo), int(hi or lo) + 1)]; print(",".join(map(str, c[:4])))' "$l3")
      echo "cpu0's last-level cache: $l3; held on $cores" >> "$OUT/cpu-layout.txt"
      small='StandardScaler fit_transform 5000x20$|LogisticRegression fit+predict 5000x20$|SVC(rbf) fit+predict 500x20$'
      for round in $(seq "${ROUNDS:-2}"); do
        step 200 "$OUT/placement.txt" python3 benchmarks/e2e.py --parts cases --only "$small" --no-sklearn-large \
          --between collect,timeit --out "$OUT/e2e-placement-free-$round.json"
        step 200 "$OUT/placement.txt" taskset -c "$cores" python3 benchmarks/e2e.py --parts cases --only "$small" \
          --no-sklearn-large --between collect,timeit --out "$OUT/e2e-placement-held-$round.json"
      done ;;
    sign)  # the same session: a header signed by a copy of one keyed HMAC; sign_cost.py before (BEFORE_SITE) and
      # after, alternated twice; then the three float32 small cases' legs after, and before
      for round in 1 2; do
        step 60 "$OUT/sign-cost.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/sign_cost.py \
          --out "$OUT/sign-cost-before-$round.json"
        step 60 "$OUT/sign-cost.txt" python3 benchmarks/sign_cost.py --out "$OUT/sign-cost-after-$round.json"
      done
      small='StandardScaler fit_transform 5000x20$|LogisticRegression fit+predict 5000x20$|SVC(rbf) fit+predict 500x20$'
      step 150 "$OUT/sign-legs-after.txt" python3 benchmarks/e2e.py --parts profile --only "$small" --out /tmp/legs.json
      step 150 "$OUT/sign-legs-before.txt" env PYTHONPATH="$BEFORE_SITE:$PYTHONPATH" python3 benchmarks/e2e.py \
        --parts profile --only "$small" --out /tmp/legs.json ;;
    wake-probe)  # issue 15, sixteenth session: does a small cuML call after an idle gap start faster when the GPU
      # is given a tiny kernel first? (device_wake.py, in process)
      step 200 "$OUT/device-wake.txt" python3 benchmarks/device_wake.py --out "$OUT/device-wake.json" ;;
    rehearse)  # the same session: the three float32 small cases with rehearsals (protocol.rehearsal: each side walks a made-up
      # message's steps while it waits on the other) and without (REHEARSE=0), in turn (in_turn), ROUNDS times
      # (default 2), the first numbered FIRST_ROUND
      small='StandardScaler fit_transform 5000x20$|LogisticRegression fit+predict 5000x20$|SVC(rbf) fit+predict 500x20$'
      ROUNDS=${ROUNDS:-2} in_turn rehearse SKLEARN_GPU_BRIDGE_REHEARSE "0 1" 250 \
        --only "$small" --no-sklearn-large --between collect,pause ;;
    rehearse-legs)  # the same: the legs of the three float32 small cases without rehearsals and with
      small='StandardScaler fit_transform 5000x20$|LogisticRegression fit+predict 5000x20$|SVC(rbf) fit+predict 500x20$'
      for rehearse in 0 1; do
        step 150 "$OUT/rehearse-legs-$rehearse.txt" env SKLEARN_GPU_BRIDGE_REHEARSE=$rehearse python3 benchmarks/e2e.py \
          --parts profile --only "$small" --out /tmp/legs.json
      done ;;
    head)  # issue 15, eighteenth session: the tree as it stands (the rehearsal's contexts made once, the tests'
      # mends) with the cuML worker: the reply slots', the rehearsals', the worker's and the trust tests; then the
      # three float32 small cases after gc.collect()s and after pauses, ROUNDS times (default 3), the first FIRST_ROUND
      # (NO_TESTS=1: the rounds alone)
      [ -n "${NO_TESTS:-}" ] || step 300 "$OUT/pytest-cuml-head.txt" "${PYTEST[@]}" -q -rfEs --tb=short \
        tests/test_reply_slot.py tests/test_rehearsal.py tests/test_worker.py tests/test_trust.py
      small='StandardScaler fit_transform 5000x20$|LogisticRegression fit+predict 5000x20$|SVC(rbf) fit+predict 500x20$'
      for round in $(seq "${FIRST_ROUND:-1}" $(( ${FIRST_ROUND:-1} + ${ROUNDS:-3} - 1 ))); do
        step 250 "$OUT/head-small.txt" python3 benchmarks/e2e.py --parts cases --only "${SMALL:-$small}" \
          --no-sklearn-large --between collect,pause --out "$OUT/e2e-head-$round.json"
      done ;;
    spin)  # the same session: why the in-process ways are faster after gc.collect() than after a pause as long. The
      # LogisticRegression pair and StandardScaler after a collection, a sleep and a busy wait (spin) as long; the
      # worker as it comes (watch_ms 3) and with its threads watching 400 ms after a reply (their cores kept busy
      # through the gaps), alternated ROUNDS times (default 2)
      small='StandardScaler fit_transform 5000x20$|LogisticRegression fit+predict 5000x20$'
      for round in $(seq "${ROUNDS:-2}"); do
        for watch in 3 400; do
          step 250 "$OUT/spin.txt" env SKLEARN_GPU_BRIDGE_WORKER_WATCH_MS=$watch python3 benchmarks/e2e.py --parts cases \
            --only "$small" --no-sklearn-large --between collect,pause,spin --out "$OUT/e2e-spin-watch-$watch-$round.json"
        done
      done ;;
    lr-repeats)  # the LogisticRegression pair with REPEATS calls of each way a run (default 200: the 90%
      # intervals of a run of 45-49 were about half a millisecond either side, results/gpu-h200-1127f), after
      # collections and after pauses, ROUNDS runs (default 2)
      for round in $(seq "${ROUNDS:-2}"); do
        step 400 "$OUT/lr-repeats.txt" python3 benchmarks/e2e.py --parts cases --only 'LogisticRegression fit+predict 5000x20$' \
          --no-sklearn-large --repeats "${REPEATS:-200}" --between collect,pause --out "$OUT/e2e-lr-repeats-$round.json"
      done ;;
    labels)  # issue 15, twentieth session: a classifier's labels encoded on the host (worker/labels.py): its tests
      # with cuML (NO_TESTS=1: none), its cost against cuML's own by number of labels, then e2e's CASES (default the
      # LogisticRegression pair) with REPEATS calls a way (default 200), SKLEARN_GPU_BRIDGE_LABELS_ON_HOST=0 and
      # the default in turn (in_turn: ROUNDS, FIRST_ROUND), into files named NAME (default labels);
      # results/gpu-h100-1128b/README.md lists the calls behind its files (then NAME.txt held both values' runs)
      [ -n "${NO_TESTS:-}" ] || step 300 "$OUT/pytest-cuml-labels.txt" "${PYTEST[@]}" -q -rfEs --tb=short \
        tests/test_labels.py tests/test_estimators.py -k "labels or Logistic or SVC"
      [ -n "${NO_TESTS:-}" ] || step 240 "$OUT/host-labels.txt" python3 benchmarks/host_labels.py \
        --out "$OUT/host-labels.json"
      in_turn "${NAME:-labels}" SKLEARN_GPU_BRIDGE_LABELS_ON_HOST "0 1" 280 \
        --only "${CASES:-LogisticRegression fit+predict 5000x20\$}" --no-sklearn-large --repeats "${REPEATS:-200}" \
        --between collect,pause ;;
    worker-gc)  # issue 15, nineteenth session: how often the collector runs inside small calls, in process and in the
      # worker (benchmarks/worker_gc.py); results/gpu-h100-1128 ran it with idle-gc.patch applied, twice (see there)
      step 120 "$OUT/worker-gc.txt" python3 benchmarks/worker_gc.py --backend cuml --out "$OUT/worker-gc.json" ;;
    oom)  # the GPU's out-of-memory test and the allocator tests under the worker's default device memory
      step 200 "$OUT/pytest-cuml-oom.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_faults.py tests/test_worker.py \
        -k "out_of_memory or device_memory or memory_pools" ;;
    dask-tests)  # issue 15, twenty-fourth session: the Dask tests on the GPU machine, where each Dask worker runs
      # cuML in its own process (Dask's wheels carried in .gpu-wheels/extra)
      step 300 "$OUT/pytest-cuml-dask.txt" "${PYTEST[@]}" -q -rfEs --tb=short tests/test_dask.py ;;
    slow-calls)  # issue 15, twenty-fourth session: the float32 LogisticRegression 1M fit's slow calls, in process and
      # bridged in a random order, some after a pause: what came before each, its iterations (slow_calls.py)
      step 200 "$OUT/slow-calls.txt" python3 benchmarks/slow_calls.py --calls 120 --out "$OUT/slow-calls.json" ;;
    slow-calls-memory)  # the same: again as it was, then in process under the worker's device memory, then the
      # worker under cuML's default (cuda), to see whether that moves the iterations each side draws
      slow_calls again
      slow_calls in-process-async --in-process-device-memory async-cupy
      slow_calls worker-cuda --worker-device-memory cuda ;;
    slow-calls-split)  # twenty-fifth session: cuML in process on a thread of its own, then the worker leaving X's copy to cuML (a
      # threshold over any X), to see which, if either, gives the bridged calls their extra iterations
      slow_calls in-process-thread --in-process-thread
      slow_calls worker-no-copy --worker-device-copy-min-bytes 1000000000000 ;;
    lr-sklearn-turns)  # twenty-fifth session: e2e's float32 LogisticRegression 1M row alone, 30 rounds, with
      # scikit-learn's fit in the turn as the table has it and then without it: in the table the bridged calls drew
      # about one iteration more than cuML's in process (14.4 / 13.4, 22 calls a way), in slow_calls.py (no
      # scikit-learn) they did not
      for sklearn_leg in with without; do
        step 150 "$OUT/lr-sklearn-$sklearn_leg.txt" python3 benchmarks/e2e.py --parts cases --repeats 30 \
          --only 'LogisticRegression fit 1M x 50$' $([ $sklearn_leg = without ] && echo --no-sklearn-large) \
          --out "$OUT/e2e-lr-sklearn-$sklearn_leg.json"
      done ;;
    slow-calls-sklearn)  # the same question in slow_calls.py's random order: scikit-learn's fit before one call in
      # three in place of the pause
      slow_calls sklearn-between --calls 90 --between sklearn ;;
    grid-njobs)  # the README's n_jobs rows: the grid with the default worker, 3 repeats
      step 400 "$OUT/grid-njobs.txt" python3 benchmarks/e2e.py --parts grid --repeats 3 \
        --grid-ways "sklearn (n_jobs=-1)|bridge|bridge n_jobs=4|bridge n_jobs=-1|cuml" --out "$OUT/e2e-grid-njobs.json" ;;
    accel)  # issue 14: a client without cuML (CLIENT_SITE) and a background cuML worker: accel, the cuML alias
      log="$OUT/accel.txt"
      step 120 "$log" python3 -m sklearn_gpu_bridge start --backend cuml
      step 30 "$log" env PYTHONPATH="$CLIENT_SITE" python3 -c "import cuml" 
      step 240 "$log" env PYTHONPATH="$CLIENT_SITE" python3 benchmarks/accel/sklearn_script.py --n-jobs -1
      step 240 "$log" env PYTHONPATH="$CLIENT_SITE" python3 -m sklearn_gpu_bridge.accel -v benchmarks/accel/sklearn_script.py
      step 120 "$log" env PYTHONPATH="$CLIENT_SITE" python3 -m sklearn_gpu_bridge.accel benchmarks/accel/cuml_quickstart.py
      step 60 "$log" python3 -m sklearn_gpu_bridge stop ;;
    dask)  # issues 16/17: LocalCUDACluster on 1 and 2 GPUs against the bridge and cuML in process, no Dask
      step 500 "$OUT/dask-grid.txt" python3 benchmarks/dask_grid.py --gpus 1 2 --candidates 12 48 \
        --out "$OUT/dask-grid.json" ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
