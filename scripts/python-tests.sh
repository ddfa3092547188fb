#!/usr/bin/env bash
# The Python side of the sidecar: clients/python's lint (ruff), types (mypy --strict) and tests
# (pytest) against real `leasehold serve` processes: both clients, the schedule translations
# against `leasehold next`, three APScheduler replicas and three Celery beats (+ a worker, Redis
# on 127.0.0.1:6379 as the broker, database 12), and the wheel installed into a fresh virtualenv
# running the snippets of its README and docs/clients.md. Packages come from PyPI at the exact versions of
# clients/python/requirements-test.txt, into a virtualenv under target/ (made again when that
# file changes). Usage: scripts/python-tests.sh [LEASEHOLD_BIN]; the binary defaults to
# $LEASEHOLD_BIN, else target/debug/leasehold. Exits non-zero if anything fails. About 2 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/binary.sh
leasehold_binary python-tests "$@"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "python-tests: $python is not Python 3.11 or later" >&2
  exit 1
fi
if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  # Debian splits venv and ensurepip off python3 (scripts/stores.sh installs it too).
  echo "python-tests: installing python3-venv" >&2
  as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq python3-venv >/dev/null
fi
redis_url="${LEASEHOLD_TEST_REDIS_URL:-redis://127.0.0.1:6379}"
export LEASEHOLD_TEST_REDIS_URL="$redis_url"
export LEASEHOLD_BIN
LEASEHOLD_BIN=$(realpath "$bin")

requirements=clients/python/requirements-test.txt
venv=target/python-venv
if ! cmp -s "$requirements" "$venv/requirements-test.txt" 2>/dev/null; then
  echo "== a virtualenv for the Python client ($venv)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$requirements"
  cp "$requirements" "$venv/requirements-test.txt"
fi
# The client itself, from the working tree (the package test builds and installs the wheel).
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-input --no-deps \
  --no-build-isolation --editable clients/python

cd clients/python
echo "== clients/python: ruff, mypy --strict ($("../../$venv/bin/python" --version))"
"../../$venv/bin/ruff" check
"../../$venv/bin/ruff" format --check
"../../$venv/bin/mypy"
echo "== clients/python: pytest"
"../../$venv/bin/python" -m pytest -q -p no:cacheprovider
