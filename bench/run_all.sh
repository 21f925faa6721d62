#!/usr/bin/env bash
# Every benchmark of issue 10, one after the other, each figure beside its baseline:
#   bronze (drain vs write_deltalake), drain (rate per batch cap, RSS), memory (one tenant's
#   backlog: peak RSS), simulate (outbox writes), retract (time vs silver size), history (commit
#   latency at version ~100 vs ~10,000).
# Issue 11's (lag under a stream with a real dagster-daemon, the sensor tick): bench/run_lag.sh.
# Results go to bench/results/<UTC stamp>/ (one .log per benchmark, .json where the benchmark
# writes one, the load average before and after each), then PNG plots into bench/plots/ when
# matplotlib is installed (pip install -e ".[bench]"); a --quick run plots into its results folder.
#
#   bench/run_all.sh            # moderate sizes
#   bench/run_all.sh --quick    # small sizes (a few minutes)
#   bench/run_all.sh --full     # the issue's sizes (1M-op drain, 5M-row retract, history on
#                               # local disk and on S3 over moto): about 25 minutes
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
SIZE=moderate
case "${1:-}" in
  --quick) SIZE=quick ;;
  --full) SIZE=full ;;
  "") ;;
  *) echo "usage: $0 [--quick|--full]" >&2; exit 2 ;;
esac

case $SIZE in
  quick)
    BRONZE=(--events 20000)
    DRAIN=(--tenants 4 --claims 500 --max-batch 1000 5000 50000)
    MEMORY=(--tenants 1 --claims 2000 --max-batch 50000)
    SIMULATE=(--tenants 4 --claims 500 --writers 2 --seed 1)
    RETRACT=(--sizes 20000 100000 --rounds 2)
    HISTORY=(--versions 1000 --samples 10)
    ;;
  moderate)
    BRONZE=(--events 200000)
    DRAIN=(--tenants 10 --claims 2000 --max-batch 1000 5000 50000)
    MEMORY=(--tenants 1 --claims 40000 --max-batch 50000)
    SIMULATE=(--tenants 10 --claims 2000 --writers 2 --seed 1)
    RETRACT=(--sizes 100000 1000000 --rounds 3 --profile)
    HISTORY=(--versions 10000 --samples 20)
    ;;
  full)
    BRONZE=(--events 200000)
    DRAIN=(--tenants 20 --claims 8300 --max-batch 5000 50000)
    MEMORY=(--tenants 1 --claims 160000 --max-batch 50000)
    SIMULATE=(--tenants 20 --claims 8300 --writers 2 --seed 2 --bad-ratio 0.01)
    RETRACT=(--sizes 100000 1000000 5000000 --rounds 3 --profile)
    # Both stores: local disk to v10,000, then an S3 API server on loopback (moto) to v5,000.
    HISTORY=(--versions 10000 --samples 20 --stores local s3 --s3-versions 5000)
    ;;
esac

OUT=bench/results/$(date -u +%Y-%m-%dT%H%MZ)-$SIZE
mkdir -p "$OUT"
echo "results: $OUT"

run() {
  local name=$1
  shift
  echo "== $name: $*" | tee "$OUT/$name.log"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/$name.log"
  local started=$SECONDS
  "$PY" "$@" 2>&1 | tee -a "$OUT/$name.log"
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); took $((SECONDS - started)) s" \
    | tee -a "$OUT/$name.log"
}

run bronze bench/bronze_bench.py "${BRONZE[@]}"
run drain bench/drain_bench.py "${DRAIN[@]}" --json "$OUT/drain.json"
run memory bench/drain_bench.py "${MEMORY[@]}" --json "$OUT/memory.json"
run simulate bench/simulate_bench.py "${SIMULATE[@]}"
run retract bench/retract_bench.py "${RETRACT[@]}" --json "$OUT/retract.json"
run history bench/history_bench.py "${HISTORY[@]}" --json "$OUT/history.json"

if "$PY" -c "import matplotlib" 2>/dev/null; then
  # A quick run's plots stay beside its results, so they never replace a real run's.
  if [ "$SIZE" = quick ]; then PLOTS=$OUT/plots; else PLOTS=bench/plots; fi
  "$PY" bench/plots.py "$OUT" "$PLOTS"
else
  echo "matplotlib not installed: no plots (pip install -e '.[bench]')"
fi
