#!/usr/bin/env bash
# Issue 11's benchmarks, one after the other, with a real dagster-daemon on this machine:
#   lag (targets 1, 2 and 4: lag under a paced stream, backlog after it, runs per minute, CPU per
#   run; bench/lag_bench.py), the sensor tick at 10,000 tenants (target 3; sensor_bench.py), and a
#   shard run's cost per tenant batch as its tables fill, packing on and off (small_files_bench.py,
#   ADR 0033).
# Results go to bench/results/<UTC stamp>-lag[-quick]/ (a .log and a .json per benchmark, the load
# average before and after each, the daemon's and producer's logs), then the lag-over-time plot
# (bench/plots/lag_over_time.png; a --quick run plots into its results folder).
# The figures mean something only on an otherwise idle machine: check `cat /proc/loadavg` first.
#
#   bench/run_lag.sh            # targets 1 and 2 (120 s streams) and the sensor tick: ~8-25 min
#   bench/run_lag.sh --quick    # smoke sizes: ~3 min
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
SIZE=full
case "${1:-}" in
  --quick) SIZE=quick ;;
  "") ;;
  *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac

case $SIZE in
  quick)
    LAG=(--config quick)
    SENSOR=(--tenants 1000 --pending 100 --steady-ticks 3)
    SMALL=(--tenants 4 --claims 150 --batch 40 --window 10)
    ;;
  full)
    LAG=(--config target1 target2)
    SENSOR=(--tenants 10000 --pending 1000 --steady-ticks 5)
    SMALL=(--tenants 10 --claims 600 --batch 40)
    ;;
esac

OUT=bench/results/$(date -u +%Y-%m-%dT%H%MZ)-lag$([ "$SIZE" = quick ] && echo -quick)
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

run lag bench/lag_bench.py "${LAG[@]}" --json "$OUT/lag.json" --logs "$OUT/logs"
# sensor_bench.py asserts one run request per pending tenant: the per-tenant mode (ADR 0021).
run sensor bench/sensor_bench.py "${SENSOR[@]}" --json "$OUT/sensor.json"
run small_files bench/small_files_bench.py "${SMALL[@]}" --json "$OUT/small_files.json"

if "$PY" -c "import matplotlib" 2>/dev/null; then
  if [ "$SIZE" = quick ]; then PLOTS=$OUT/plots; else PLOTS=bench/plots; fi
  "$PY" bench/plots.py "$OUT" "$PLOTS"
else
  echo "matplotlib not installed: no plots (pip install -e '.[bench]')"
fi
