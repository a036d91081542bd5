#!/usr/bin/env bash
# Quickstart smoke on the embedded database, as a new user meets it: start `manage.py quickstart`
# as the README says, run the README's example block exactly as written, stop with Ctrl-C, start
# it again (it must keep what it made), and run every loop's one-pass form and the invariant
# checker.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"   # absolute, not resolved: the venv's own
WORK=$(mktemp -d)
unset DATABASE_URL SCHEDULER_VAR_DIR
# A copy of the checkout's files (as a fresh clone has them: no var/), so the README's relative
# paths hold and a developer's own var/ is left alone.
mkdir "$WORK/tree"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$WORK/tree"
cd "$WORK/tree"
QS_PID=""
cleanup() { [ -n "$QS_PID" ] && kill -INT -- "-$QS_PID" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT

start_quickstart() {
  # Its own process group, as in a terminal: Ctrl-C (SIGINT) reaches it and gunicorn alike.
  setsid $PY manage.py quickstart >"$WORK/qs$1.log" 2>&1 &
  QS_PID=$!
  for _ in $(seq 1 60); do
    curl -sf "http://127.0.0.1:8000/readyz" >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "smoke: quickstart did not answer"; cat "$WORK/qs$1.log"; exit 1
}

stop_quickstart() {
  local started=$SECONDS
  kill -INT -- "-$QS_PID"
  for _ in $(seq 1 100); do kill -0 "$QS_PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$QS_PID" 2>/dev/null; then echo "smoke: quickstart still running 10 s after Ctrl-C"; exit 1; fi
  if curl -s --max-time 5 -o /dev/null "http://127.0.0.1:8000/healthz"; then echo "smoke: port 8000 still answers after Ctrl-C"; exit 1; fi
  echo "smoke: stopped $((SECONDS - started)) s after Ctrl-C"
  QS_PID=""
}

start_quickstart 1
grep -q "Ctrl-C to stop" "$WORK/qs1.log" || { echo "smoke: quickstart does not say how to stop"; exit 1; }
grep -q "signing secret" "$WORK/qs1.log" || { echo "smoke: quickstart does not print the signing secret"; exit 1; }

# The README's example block, exactly as written (the one that starts by reading quickstart.env).
$PY - <<'EOF' >"$WORK/readme.sh"
import re
blocks = re.findall(r"```sh\n(.*?)```", open("README.md").read(), re.S)
print(next(b for b in blocks if b.startswith(". var/quickstart.env")))
EOF
sleep 8   # the demo's failing run needs its two attempts before the block looks for a dead run
bash -euo pipefail "$WORK/readme.sh" >"$WORK/readme.out" 2>&1 || { echo "smoke: the README block failed"; cat "$WORK/readme.out"; exit 1; }
grep -q '"state":"succeeded"' "$WORK/readme.out" || { echo "smoke: the README's run did not succeed"; cat "$WORK/readme.out"; exit 1; }
grep -q '"version":2' "$WORK/readme.out" || { echo "smoke: the README's edit did not make version 2"; cat "$WORK/readme.out"; exit 1; }
grep -q '"state":"ready"' "$WORK/readme.out" || { echo "smoke: the README's retry did not make the dead run ready"; cat "$WORK/readme.out"; exit 1; }
grep -q "Traceback" "$WORK/qs1.log" && { echo "smoke: the quickstart logged an error"; grep -B2 -A20 "Traceback" "$WORK/qs1.log" | head -60; exit 1; }
stop_quickstart

# Run again: the same demo, one live quickstart key.
start_quickstart 2
. var/quickstart.env
count=$(curl -s "$BASE/api/v1/schedules" -H "Authorization: Bearer $KEY" | $PY -c 'import json,sys; print(sum(s["name"].startswith("demo-") for s in json.load(sys.stdin)["results"]))')
[ "$count" = 3 ] || { echo "smoke: $count demo schedules after a second start, expected 3"; exit 1; }
keys=$(curl -s "$BASE/api/v1/keys" -H "Authorization: Bearer $KEY" | $PY -c 'import json,sys; print(sum(k["label"] == "quickstart" and k["active"] for k in json.load(sys.stdin)["results"]))')
[ "$keys" = 1 ] || { echo "smoke: $keys live quickstart keys after a second start, expected 1"; exit 1; }
stop_quickstart

# Every loop's one-pass form and the invariant checker must also work on the embedded database.
$PY manage.py scan --once
$PY manage.py reconcile --once
$PY manage.py relay --once
$PY manage.py check_invariants || { echo "smoke: the invariant checker found violations on the embedded database"; exit 1; }
$PY manage.py audit >/dev/null || { echo "smoke: manage.py audit (the contract's name) failed"; exit 1; }
echo "smoke: quickstart ok (README block ran as written; Ctrl-C stopped it; a second start kept what it made)"
