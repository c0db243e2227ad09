#!/usr/bin/env bash
# Cluster-level figures for docs/BENCHMARKS.md ("cluster: scaling, handoff,
# tenants"), measured with the real binary on loopback. Rerun:
#
#   scripts/bench-cluster.sh            # everything (~6 min on 2 cores)
#   scripts/bench-cluster.sh append e2e # a subset: append e2e handoff replication sync
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
  curl -fsS -H 'Content-Type: application/json' -XPUT 127.0.0.2:8080/v1/namespaces/bench -d '{"paused":true}' >/dev/null
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
  curl -fsS -H 'Content-Type: application/json' -XPUT 127.0.0.2:8080/v1/namespaces/bench -d '{"paused":true}' >/dev/null
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

# lag_p99 N: the p99 of fairshard_replication_lag_seconds over nodes 1..N
# (the upper bound of the histogram bucket holding the 99th percentile).
lag_p99() {
  for i in $(seq "$1"); do curl -fsS "http://127.0.0.$((i + 1)):8080/metrics"; done |
    sed -nE 's/^fairshard_replication_lag_seconds_bucket\{le="([^"]+)"\} (.*)/\1 \2/p' |
    awk '{n[$1] += $2} END {for (l in n) print l, n[l]}' | sed 's/^+Inf/inf/' | sort -g |
    awk '{le[NR] = $1; c[NR] = $2} END {
           if (NR == 0 || c[NR] == 0) { print "no samples"; exit }
           for (i = 1; i <= NR; i++) if (c[i] >= 0.99 * c[NR]) { printf "%s s (%d samples)\n", le[i], c[NR]; exit } }'
}

# Replicated shards (issue 14): R = 1 beside R = 2 on 3 nodes, each in one
# run: durable append over HTTP (64 producers x 16-row batches), end to end
# delivery, replication lag p99 under that load, RSS and disk per 1M rows
# per copy. REPL_ROWS rows per figure.
bench_replication() {
  local rows=${REPL_ROWS:-$ROWS}
  for r in 1 2; do
    echo "== R = $r: durable append over HTTP, 3 nodes, 64 producers x 16-row batches (namespace paused); load: $(cut -d' ' -f1-3 /proc/loadavg)"
    for i in 1 2 3; do node "$i" --replication-factor "$r"; done
    curl -fsS -H 'Content-Type: application/json' -XPUT 127.0.0.2:8080/v1/namespaces/bench -d '{"paused":true}' >/dev/null
    sleep 1
    local rss0=0 rss=0 disk0=0 disk=0
    for i in 1 2 3; do
      rss0=$((rss0 + $(awk '/VmRSS/ {print $2}' /proc/"${pids[$((i - 1))]}"/status)))
      disk0=$((disk0 + $(stat -c %s "$WORK/n$i/fairshard.db")))
    done
    "$BIN" load --nodes "$(urls 3)" --namespaces bench:1 --rows "$rows" --duration 0 --batch 16 --concurrency 64 | tail -3
    for i in 1 2 3; do
      rss=$((rss + $(awk '/VmRSS/ {print $2}' /proc/"${pids[$((i - 1))]}"/status)))
      disk=$((disk + $(stat -c %s "$WORK/n$i/fairshard.db")))
    done
    echo "R = $r: $rows rows x $r copies: RSS sum $((rss0 / 1024)) -> $((rss / 1024)) MiB, data files $((disk0 / 1048576)) -> $((disk / 1048576)) MiB;" \
      "growth per 1M rows per copy: RSS $(((rss - rss0) * 1000000 / rows / r / 1024)) MiB, disk $(((disk - disk0) * 1000000 / rows / r / 1048576)) MiB"
    stop_all
    echo "== R = $r: end to end, 3 nodes: append -> deliver to a no-op target -> done; load: $(cut -d' ' -f1-3 /proc/loadavg)"
    for i in 1 2 3; do node "$i" --replication-factor "$r" $TARGET; done
    sleep 1
    "$BIN" load --nodes "$(urls 3)" --namespaces a:1:4,b:1:4 --rows "$rows" --duration 0 --batch 16 \
      --concurrency 64 --target-addr 127.0.0.1:9300 --wait 180s | tail -5
    [ "$r" -gt 1 ] && echo "R = $r: replication lag p99 under that load: $(lag_p99 3)"
    stop_all
  done
}

# Shard sync on join (issue 14 scenario 7): SYNC_ROWS pending rows on one
# node (R = 2), a second node joins and copies every one.
bench_sync() {
  local rows=${SYNC_ROWS:-1000000}
  echo "== shard sync: $rows pending rows on n1 (R = 2), n2 joins; load: $(cut -d' ' -f1-3 /proc/loadavg)"
  node 1 --replication-factor 2 --handoff-batch 4000
  curl -fsS -H 'Content-Type: application/json' -XPUT 127.0.0.2:8080/v1/namespaces/bench -d '{"paused":true}' >/dev/null
  "$BIN" load --nodes "$(urls 1)" --namespaces bench:1 --rows "$rows" --duration 0 --batch 500 --concurrency 16 | head -n -1 | tail -2
  start=$(date +%s.%N)
  node 2 --replication-factor 2 --handoff-batch 4000
  while :; do
    s1=$(curl -fsS 127.0.0.2:8080/v1/cluster | sed 's/.*"under_replicated":\([a-z]*\).*/\1/')
    s2=$(curl -fsS 127.0.0.3:8080/v1/cluster | sed 's/.*"syncing_shards":\([0-9]*\).*/\1/')
    [ "$s1" = "false" ] && [ "$s2" = "0" ] && break
    sleep 0.2
  done
  end=$(date +%s.%N)
  synced=$(metric 2 'fairshard_replication_sync_rows_total{kind="bulk"}')
  t=$(echo "$end - $start" | bc)
  echo "sync: n2 copied $synced rows in $t s from its start ($(echo "$synced $t" | awk '{printf "%.0f", $1 / $2}') rows/s); load: $(cut -d' ' -f1-3 /proc/loadavg)"
  stop_all
}

what=${*:-append e2e handoff replication sync}
for w in $what; do "bench_$w"; done
rm -rf "$WORK"
