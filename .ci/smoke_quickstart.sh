#!/usr/bin/env bash
# Quickstart smoke on the embedded database: start the scheduler as the README says, create a
# schedule through the API with a local target, trigger it, and see its run succeed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WORK=$(mktemp -d)
export SCHEDULER_VAR_DIR="$WORK"
unset DATABASE_URL
PORT_WEB=18765
PORT_TARGET=19000
cleanup() { kill "$QS_PID" "$TARGET_PID" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT

$PY -m http.server "$PORT_TARGET" --bind 127.0.0.1 --directory "$WORK" >"$WORK/target.log" 2>&1 &
TARGET_PID=$!
$PY manage.py quickstart --addr "127.0.0.1:$PORT_WEB" --allow-target "http://127.0.0.1:$PORT_TARGET/" >"$WORK/qs.log" 2>&1 &
QS_PID=$!
for _ in $(seq 1 60); do
  curl -sf "http://127.0.0.1:$PORT_WEB/readyz" >/dev/null 2>&1 && break
  sleep 1
done
KEY=$(grep -m1 "API key" "$WORK/qs.log" | awk '{print $3}')
[ -n "$KEY" ] || { echo "smoke: no API key printed"; cat "$WORK/qs.log"; exit 1; }
AUTH="Authorization: Bearer $KEY"
SID=$(curl -s -X POST "http://127.0.0.1:$PORT_WEB/api/v1/schedules" -H "$AUTH" -H 'Content-Type: application/json' \
  -d "{\"expression\":\"0 3 * * *\",\"timeZone\":\"Europe/Berlin\",\"target\":{\"url\":\"http://127.0.0.1:$PORT_TARGET/\",\"method\":\"GET\"}}" \
  | $PY -c 'import json,sys; print(json.load(sys.stdin)["id"])')
RID=$(curl -sf -X POST "http://127.0.0.1:$PORT_WEB/api/v1/schedules/$SID/trigger" -H "$AUTH" \
  | $PY -c 'import json,sys; print(json.load(sys.stdin)["id"])')
STATE=""
for _ in $(seq 1 30); do
  STATE=$(curl -sf "http://127.0.0.1:$PORT_WEB/api/v1/runs/$RID" -H "$AUTH" | $PY -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  [ "$STATE" = "succeeded" ] && break
  sleep 1
done
if [ "$STATE" != "succeeded" ]; then
  echo "smoke: run $RID is $STATE, expected succeeded"; tail -50 "$WORK/qs.log"; exit 1
fi
grep -q "GET / HTTP" "$WORK/target.log" || { echo "smoke: the target saw no call"; exit 1; }
# Every loop's one-pass form and the invariant checker must also work on the embedded database.
$PY manage.py scan --once
$PY manage.py reconcile --once
$PY manage.py relay --once
$PY manage.py check_invariants || { echo "smoke: the invariant checker found violations on the embedded database"; exit 1; }
$PY manage.py audit >/dev/null || { echo "smoke: manage.py audit (the contract's name) failed"; exit 1; }
if grep -q "Traceback" "$WORK/qs.log"; then
  echo "smoke: the quickstart logged an error"; grep -B2 -A20 "Traceback" "$WORK/qs.log" | head -60; exit 1
fi
echo "smoke: quickstart ok (schedule $SID, run $RID succeeded)"
