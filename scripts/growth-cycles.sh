#!/usr/bin/env bash
# The data file's size over fill-and-drain cycles (issue #16 item 1), with
# the real binary on loopback: one node, default flags (plus a delivery
# target), CYCLES × ROWS rows of ~PAYLOAD-byte payloads appended and fully
# delivered; after each cycle the file size and the rows the node holds.
#
#   scripts/growth-cycles.sh               # 3 × 100,000 rows of ~200 bytes
#   CYCLES=5 ROWS=50000 scripts/growth-cycles.sh
#
# The node listens on 127.0.16.2 and the target on 127.0.16.1 (addresses
# the other scripts do not use). Nothing is left running when it exits.
set -euo pipefail
cd "$(dirname "$0")/.."

WORK=${WORK:-$(mktemp -d /tmp/fairshard-growth.XXXXXX)}
BIN=$WORK/fairshard
CYCLES=${CYCLES:-3}
ROWS=${ROWS:-100000}
PAYLOAD=${PAYLOAD:-200}
IP=127.0.16.2
go build -o "$BIN" ./cmd/node
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true; }
trap cleanup EXIT

"$BIN" serve --node-name g1 --data-dir "$WORK/g1" --http-addr "$IP:8080" --gossip-addr "$IP:7946" \
  --default-target "http://127.0.16.1:9300/deliver" --log-level warn >"$WORK/g1.log" 2>&1 &
pid=$!
for _ in $(seq 100); do curl -fsS "http://$IP:8080/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
file=$WORK/g1/fairshard.db
[ -f "$file" ] || file=$(find "$WORK/g1" -name '*.db' | head -1)
echo "uptime: $(uptime)"
printf '%-6s %10s %7s %14s %7s %10s\n' cycle file_MiB ratio highwater_MiB ratio done_rows
# highwater FILE: the bytes bbolt uses (high-water page id × page size,
# from the meta page with the higher txid). The file itself grows in 16 MiB
# steps (bbolt's AllocSize), so its size moves in steps; this does not.
highwater() {
  local best=0 hw=0 off
  for off in 0 4096; do
    local ps pgid txid
    ps=$(od -An -t u4 -j $((off + 24)) -N 4 "$1" | tr -d ' ')
    pgid=$(od -An -t u8 -j $((off + 56)) -N 8 "$1" | tr -d ' ')
    txid=$(od -An -t u8 -j $((off + 64)) -N 8 "$1" | tr -d ' ')
    if [ "$txid" -ge "$best" ]; then best=$txid; hw=$((pgid * ps)); fi
  done
  echo "$hw"
}
first=
firsthw=
for c in $(seq "$CYCLES"); do
  "$BIN" load --nodes "http://$IP:8080" --rows "$ROWS" --duration 0 --batch 100 --concurrency 16 \
    --payload-bytes "$PAYLOAD" --namespaces "c$c:1:4" --target-addr 127.0.16.1:9300 --wait 300s >"$WORK/load$c.log" 2>&1 ||
    { echo "load cycle $c failed:"; tail -20 "$WORK/load$c.log"; exit 1; }
  grep -q "^delivered $ROWS (distinct $ROWS" "$WORK/load$c.log" ||
    { echo "cycle $c: not every row delivered:"; tail -8 "$WORK/load$c.log"; exit 1; }
  # Every row done: nothing pending or claimed on the node.
  for _ in $(seq 600); do
    live=$(curl -fsS "http://$IP:8080/metrics" | awk '$1 ~ /^fairshard_store_rows\{status="(pending|claimed)"\}/ {s += $2} END {print s+0}')
    [ "$live" = 0 ] && break; sleep 0.5
  done
  done_rows=$(curl -fsS "http://$IP:8080/metrics" | awk '$1 == "fairshard_store_rows{status=\"done\"}" {print $2}')
  size=$(stat -c %s "$file")
  hw=$(highwater "$file")
  [ -z "$first" ] && first=$size && firsthw=$hw
  printf '%-6s %10.1f %7.2f %14.1f %7.2f %10s\n' "$c" "$(echo "$size/1048576" | bc -l)" "$(echo "$size/$first" | bc -l)" \
    "$(echo "$hw/1048576" | bc -l)" "$(echo "$hw/$firsthw" | bc -l)" "$done_rows"
done
