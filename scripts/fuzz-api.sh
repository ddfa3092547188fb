#!/usr/bin/env bash
# Fuzzes the sidecar's HTTP API from its own OpenAPI document with schemathesis (from PyPI, in a
# virtualenv under target/): every operation gets schema-valid and schema-violating requests,
# and every answer must be a documented status with a body that fits its schema, never a 5xx
# from a bug. Usage: scripts/fuzz-api.sh [LEASEHOLD_BIN]; FUZZ_SEED picks another seed.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:-${LEASEHOLD_BIN:-target/debug/leasehold}}
venv=$PWD/target/schemathesis-venv
version=4.32.5
if [ ! -x "$venv/bin/schemathesis" ] || ! "$venv/bin/schemathesis" --version | grep -q "$version"; then
  echo "fuzz-api: installing schemathesis $version into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "schemathesis==$version"
fi

dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# Long-polls answer within 200 ms so that waits the fuzzer asks for do not stall the run.
"$bin" serve --store "sqlite:$dir/fuzz.db" --listen "127.0.0.1:$port" --max-wait 200ms \
  >"$dir/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$dir"' EXIT
python3 - "$port" <<'PY'
import sys, time, urllib.request
for _ in range(100):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthz", timeout=1)
        break
    except OSError:
        time.sleep(0.1)
PY

# positive_data_acceptance is left out: some valid-looking input is refused by meaning, which a
# schema cannot say (a cron expression that does not parse, every_ms together with cron, a
# keepalive_ms below 100). Everything else is checked: negative data must be refused, answers
# must match the document. One worker: schemathesis' coverage phase is not thread-safe.
# Response times are not what this run checks: the fuzzer leaves hundreds of leases with 1 s
# ttls and day-long keepalives, which the sidecar renews every 333 ms each on one SQLite file, and
# requests queue behind those writes (15 s once on a loaded CI host); hence the generous limits.
status=0
# From the temporary directory, where schemathesis keeps its example database.
(cd "$dir" && "$venv/bin/schemathesis" run "http://127.0.0.1:$port/openapi.json" \
  --checks all --exclude-checks positive_data_acceptance \
  --max-examples 60 --workers 1 --request-timeout 60 --max-response-time 60 \
  --seed "${FUZZ_SEED:-20261204}") || status=$?
if ! kill -0 $server 2>/dev/null; then
  echo "fuzz-api: the sidecar died during the run:" >&2
  tail -20 "$dir/serve.log" >&2
  exit 1
fi
if grep -q "panicked" "$dir/serve.log"; then
  echo "fuzz-api: the sidecar panicked:" >&2
  grep -A5 panicked "$dir/serve.log" >&2
  exit 1
fi
exit $status
