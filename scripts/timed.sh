#!/usr/bin/env bash
# timed.sh NAME CMD...: runs CMD, then prints how long it took, so the
# gate's log shows where its minutes go (CONTRIBUTING.md "Tiers").
name=$1
shift
start=$SECONDS
"$@"
rc=$?
echo "== step $name: $((SECONDS - start)) s (exit $rc)"
exit $rc
