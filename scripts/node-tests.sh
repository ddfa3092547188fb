#!/usr/bin/env bash
# The Node side of the sidecar: the TypeScript client's tests and the NestJS example's end-to-end
# test, against real `leasehold serve` processes and redis-servers of their own. Installs the
# npm packages from the committed lockfiles. Usage: scripts/node-tests.sh [LEASEHOLD_BIN].
set -euo pipefail
cd "$(dirname "$0")/.."
export LEASEHOLD_BIN
LEASEHOLD_BIN=$(realpath "${1:-${LEASEHOLD_BIN:-target/debug/leasehold}}")

echo "== clients/typescript"
(cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error && npm test)
echo "== examples/nestjs-sweeps"
(cd examples/nestjs-sweeps && npm ci --no-audit --no-fund --loglevel=error && npm test)
