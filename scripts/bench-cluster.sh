#!/usr/bin/env bash
# Cluster-level figures for docs/BENCHMARKS.md ("cluster: scaling, handoff,
# tenants"), measured with the real binary on loopback. Rerun:
#
#   scripts/bench-cluster.sh            # everything (~6 min on 2 cores)
#   scripts/bench-cluster.sh append e2e # a subset: append e2e scale handoff rss
#
# Every node gets its own 127.0.0.N address, data dir under $WORK, and logs
# there. Nothing is left running when it exits.
set -euo pipefail
cd "$(dirname "$0")/.."

WORK=${WORK:-$(mktemp -d /tmp/fairshard-bench.XXXXXX)}
BIN=$WORK/fairshard
ROWS=${ROWS:-200000}
HANDOFF_ROWS=${HANDOFF_ROWS:-1000000}
go build -o "$BIN" ./cmd/node
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# node I [extra flags…]: start node nI on 127.0.0.(I+1), joining node 1.
node() {
  local i=$1; shift
  local ip=127.0.0.$((i + 1))
  local join=()
  [ "$i" -gt 1 ] && join=(--join 127.0.0.2:7946)
  "$BIN" serve --node-name "n$i" --data-dir "$WORK/n$i" --http-addr "$ip:8080" \
    --gossip-addr "$ip:7946" --log-level warn "${join[@]}" "$@" >"$WORK/n$i.log" 2>&1 &
  pids+=($!); disown $!
  for _ in $(seq 100); do curl -fsS "http://$ip:8080/readyz" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "node n$i did not become ready; log:" >&2; tail -20 "$WORK/n$i.log" >&2; exit 1
}
stop_all() { cleanup; pids=(); sleep 0.5; rm -rf "$WORK"/n*; }
metric() { curl -fsS "http://127.0.0.$(($1 + 1)):8080/metrics" | awk -v m="$2" '$1 == m {print $2}'; }
urls() { local out=""; for i in $(seq "$1"); do out+="http://127.0.0.$((i + 1)):8080,"; done; echo "${out%,}"; }
TARGET="--default-target http://127.0.0.1:9300/deliver"

bench_append() {
  echo "== single-node durable append (namespace paused: nothing is delivered)"
  node 1
  curl -fsS -XPUT 127.0.0.2:8080/v1/namespaces/bench -d '{"paused":true}' >/dev/null
  "$BIN" load --nodes "$(urls 1)" --namespaces bench:1 --rows "$ROWS" --duration 0 --batch 100 --concurrency 16 | tail -3
  stop_all
}

bench_e2e() {
  for n in 1 3; do
    echo "== end to end, $n node(s): append → deliver to a no-op target → done"
    for i in $(seq "$n"); do node "$i" $TARGET; done
    "$BIN" load --nodes "$(urls "$n")" --namespaces a:1:4,b:1:4 --rows "$ROWS" --duration 0 --batch 100 \
      --concurrency 16 --target-addr 127.0.0.1:9300 --wait 120s | tail -5
    stop_all
  done
}

bench_handoff() {
  echo "== handoff: $HANDOFF_ROWS pending rows on one node, then a second node joins"
  node 1 --handoff-batch 2000 --shutdown-grace 10m
  curl -fsS -XPUT 127.0.0.2:8080/v1/namespaces/bench -d '{"paused":true}' >/dev/null
  "$BIN" load --nodes "$(urls 1)" --namespaces bench:1 --rows "$HANDOFF_ROWS" --duration 0 --batch 500 --concurrency 16 | head -n -1 | tail -2
  echo "rss of n1 with $HANDOFF_ROWS pending rows: $(awk '/VmRSS/ {print $2, $3}' /proc/"${pids[0]}"/status); data file: $(du -h "$WORK/n1/fairshard.db" | cut -f1)"
  start=$(date +%s.%N)
  node 2 --handoff-batch 2000
  while :; do
    pending=$(metric 1 fairshard_handoff_shards_pending)
    sent=$(metric 1 fairshard_handoff_rows_sent_total)
    [ "${pending:-1}" = "0" ] && [ "${sent:-0}" != "0" ] && break
    sleep 0.2
  done
  end=$(date +%s.%N)
  echo "join: n1 handed off $sent rows to n2 in $(echo "$end - $start" | bc) s (from n2's start; includes its join)"
  start=$(date +%s.%N)
  kill -TERM "${pids[0]}"
  while kill -0 "${pids[0]}" 2>/dev/null; do sleep 0.1; done
  end=$(date +%s.%N)
  echo "drain: SIGTERM of n1 handed its remaining rows to n2 and exited in $(echo "$end - $start" | bc) s"
  echo "n2 pending: $(curl -fsS 127.0.0.3:8080/v1/namespaces/bench | sed 's/.*"pending":\([0-9]*\).*/\1/')"
  stop_all
}

what=${*:-append e2e handoff}
for w in $what; do "bench_$w"; done
rm -rf "$WORK"
