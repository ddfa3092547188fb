#!/usr/bin/env bash
# The sidecar's live page in a real browser: tests/page/*.test.mjs drive Debian's chromium with
# playwright-core (npm ci from the committed lockfile into tests/page/node_modules; the browser
# comes from apt, installed here when missing; playwright downloads none): the page itself
# (page.test.mjs), DNS rebinding refused (rebinding.test.mjs) and every kind of task name opened
# (names.test.mjs). Screenshots of each state go to target/page-test/. Usage:
# scripts/page-test.sh [LEASEHOLD_BIN]; the binary defaults to $LEASEHOLD_BIN, else
# target/debug/leasehold. About a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/binary.sh
leasehold_binary page-test "$@"
chromium="${CHROMIUM:-$(command -v chromium || true)}"
if [ -z "$chromium" ]; then
  echo "page-test: installing Debian's chromium"
  if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
  chromium=$(command -v chromium)
fi
command -v node >/dev/null || { echo "page-test: node is not on PATH" >&2; exit 1; }
export CHROMIUM="$chromium" LEASEHOLD_BIN PAGE_TEST_OUT
LEASEHOLD_BIN=$(realpath "$bin")
PAGE_TEST_OUT=$(realpath -m target/page-test)
echo "== the sidecar's page in $("$chromium" --version 2>/dev/null || echo chromium)"
cd tests/page
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --prefer-offline --no-audit --no-fund --loglevel=error
failed=0
for test in page rebinding names; do
  echo "== $test.test.mjs"
  node "$test.test.mjs" || failed=1
done
exit "$failed"
