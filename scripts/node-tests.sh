#!/usr/bin/env bash
# The Node side of the sidecar: the TypeScript client's tests and the NestJS example's end-to-end
# test, against real `leasehold serve` processes and redis-servers of their own (redis-server from
# PATH: scripts/stores.sh installs it). Installs the npm packages from the committed lockfiles
# (npm ci, cache first). Usage: scripts/node-tests.sh [LEASEHOLD_BIN]; the binary defaults to
# $LEASEHOLD_BIN, else target/debug/leasehold. Exits non-zero if anything fails. About two minutes
# (the replicas test installs node-cron, NestJS and TypeScript into a fresh project; faketime from
# scripts/stores.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/binary.sh
leasehold_binary node-tests "$@"
for tool in node npm redis-server redis-cli faketime; do
  command -v "$tool" >/dev/null || { echo "node-tests: $tool is not on PATH (scripts/stores.sh installs it)" >&2; exit 1; }
done
# NestJS 11 needs Node 20; the tests use import.meta.dirname and --test-timeout (Node 20.11).
# (Debian 12's own nodejs package is 18: install Node 20 from elsewhere, e.g. NodeSource.)
if ! node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 11) ? 0 : 1)'; then
  echo "node-tests: Node $(node --version) is too old; these tests need Node 20.11 or later" >&2
  exit 1
fi
export LEASEHOLD_BIN
LEASEHOLD_BIN=$(realpath "$bin")
npm_ci() { npm ci --prefer-offline --no-audit --no-fund --loglevel=error; }

# The client first: the example depends on it (file:../../clients/typescript) and on its build.
echo "== clients/typescript (node $(node --version))"
(cd clients/typescript && npm_ci && npm test)
echo "== examples/nestjs-sweeps"
(cd examples/nestjs-sweeps && npm_ci && npm test)
