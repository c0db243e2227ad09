#!/usr/bin/env bash
# Memory of one dead-letter page (issue #16 item 2), with the real binary on
# loopback: two nodes, 200 dead letters with 1 MiB payloads (a target that
# answers 422), then GET /v1/namespaces/dl/dead-letters?limit=1000 on the
# first node, and the same page by page until the end. Prints the answer's
# size, and the answering node's RSS before and its peak during the
# requests (VmRSS sampled every 10 ms from /proc; RssAnon beside it: the
# heap, without the data file's mmap'd pages).
#
#   scripts/deadletter-rss.sh            # BIN=path/to/fairshard to measure another build
#
# Nodes listen on 127.0.18.2 and .3, the target on 127.0.18.1. Nothing is
# left running when it exits.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-$(mktemp -d /tmp/fairshard-dlrss.XXXXXX)}
if [ -z "${BIN:-}" ]; then BIN=$WORK/fairshard; go build -o "$BIN" ./cmd/node; fi
ROWS=${ROWS:-200}
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

python3 - "$WORK/reject.py" <<'PY'
import sys
open(sys.argv[1], "w").write('''
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(422); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.18.1", 9400), H).serve_forever()
''')
PY
python3 "$WORK/reject.py" & pids+=($!)

node() {
  local i=$1 ip=127.0.18.$(($1 + 1)) join=()
  [ "$i" -gt 1 ] && join=(--join 127.0.18.2:7946)
  "$BIN" serve --node-name "d$i" --data-dir "$WORK/d$i" --http-addr "$ip:8080" --gossip-addr "$ip:7946" \
    --default-target http://127.0.18.1:9400/reject --log-level warn "${join[@]}" >"$WORK/d$i.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do curl -fsS "http://$ip:8080/readyz" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "node d$i not ready"; tail "$WORK/d$i.log"; exit 1
}
node 1; pid1=${pids[-1]}
node 2
sleep 2
# 200 rows of 1 MiB, 6 per request (the 10 MiB request limit).
python3 - "$WORK" "$ROWS" <<'PY'
import base64, json, os, sys
work, rows = sys.argv[1], int(sys.argv[2])
p = base64.b64encode(os.urandom(1 << 20)).decode()
for b in range(0, rows, 6):
    batch = [{"dispatch_key": "dl-%04d" % i, "namespace": "dl", "payload_base64": p} for i in range(b, min(b + 6, rows))]
    open("%s/batch-%04d.json" % (work, b), "w").write(json.dumps({"rows": batch}))
PY
for f in "$WORK"/batch-*.json; do
  curl -fsS -o /dev/null -H 'Content-Type: application/json' -XPOST http://127.0.18.2:8080/v1/rows --data-binary @"$f"
done
rm -f "$WORK"/batch-*.json
dead() { local s=0; for ip in 127.0.18.2 127.0.18.3; do s=$((s + $(curl -fsS http://$ip:8080/v1/namespaces/dl | python3 -c 'import json,sys; print(json.load(sys.stdin)["dead_letters"])'))); done; echo $s; }
for _ in $(seq 600); do [ "$(dead)" -ge "$ROWS" ] && break; sleep 0.2; done
echo "uptime: $(uptime)"
echo "dead letters: $(dead) over 2 nodes"
kb() { awk -v k="$1:" '$1 == k {print $2}' /proc/$pid1/status; }
sample() { local max=0 amax=0; while [ -f "$WORK/sampling" ]; do r=$(kb VmRSS); a=$(kb RssAnon); [ "$r" -gt "$max" ] && max=$r; [ "$a" -gt "$amax" ] && amax=$a; sleep 0.01; done; echo "$max $amax" >"$WORK/peak"; }
measure() { # measure NAME QUERY...: one or all pages
  local name=$1 q=$2 all=${3:-}
  local r0 a0; r0=$(kb VmRSS); a0=$(kb RssAnon)
  touch "$WORK/sampling"; sample & local sp=$!
  local after= pages=0 bytes=0 maxb=0 rows=0
  while :; do
    curl -fsS -o "$WORK/page.json" "http://127.0.18.2:8080/v1/namespaces/dl/dead-letters?$q&after=$after"
    b=$(stat -c %s "$WORK/page.json"); bytes=$((bytes + b)); [ "$b" -gt "$maxb" ] && maxb=$b; pages=$((pages + 1))
    read -r n next < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(len(d["rows"]), d.get("next") or "-")' "$WORK/page.json")
    rows=$((rows + n))
    [ -z "$all" ] || [ "$next" = "-" ] && break
    after=$next
  done
  rm -f "$WORK/sampling"; wait $sp
  read -r rmax amax <"$WORK/peak"
  printf '%-40s pages %3d rows %4d  largest answer %7.1f MiB  RSS %4d → peak %4d MiB (anon %4d → %4d)\n' "$name" "$pages" "$rows" \
    "$(echo "$maxb/1048576" | bc -l)" $((r0 / 1024)) $((rmax / 1024)) $((a0 / 1024)) $((amax / 1024))
}
measure "limit=1000 (one page)" "limit=1000"
measure "limit=1000, every page" "limit=1000" all
measure "limit=1000&include_payload=false" "limit=1000&include_payload=false" all
