#!/usr/bin/env bash
# The whole test suite: stores, formatting, lints, packaging, the sidecar API's compatibility with
# the previous release, unit/integration/doc tests (the version-skew test among them), the short
# chaos run, the sidecar's API fuzzing, the Node client and NestJS example and the Python client
# (with APScheduler and Celery beat replicas) against real sidecars, and the sidecar's page in a
# real browser.
# This is the command the README gives and CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/stores.sh
# Valkey 9 on 127.0.0.1:6391, for the Redis store's conformance, chaos and skew runs against it.
LEASEHOLD_TEST_VALKEY_SERVER=$(bash scripts/valkey.sh)
export LEASEHOLD_TEST_VALKEY_SERVER
export LEASEHOLD_TEST_VALKEY_URL="${LEASEHOLD_TEST_VALKEY_URL:-redis://127.0.0.1:6391}"
# A clean build gains nothing from incremental compilation, which only costs disk and time.
export CARGO_INCREMENTAL=0
export LEASEHOLD_TEST_REDIS_URL="${LEASEHOLD_TEST_REDIS_URL:-redis://127.0.0.1:6379}"
export LEASEHOLD_TEST_POSTGRES_URL="${LEASEHOLD_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
export LEASEHOLD_TEST_MYSQL_URL="${LEASEHOLD_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
# The core without its default features (no cron, no chrono) must build as well.
cargo clippy -p leasehold --all-targets --no-default-features --locked -- -D warnings
echo "== packaging: every published crate packs (in dependency order, each against the others)"
cargo package --workspace --exclude leasehold-testkit --exclude leasehold-examples \
  --no-verify --allow-dirty --locked --quiet
echo "== cargo doc -D warnings"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --all-features --locked
echo "== sidecar HTTP API: only additive changes since the previous release (openapi.json)"
python3 scripts/openapi-compat.py --self-test
python3 scripts/openapi-compat.py
echo "== the previous release's leasehold, for the version-skew test (tests/skew.rs)"
# Built before the tests, into this target directory (its dependencies are mostly shared):
# the next cargo build links this release's binary back in place.
LEASEHOLD_PREVIOUS_RELEASE=$(bash scripts/previous-release.sh)
export LEASEHOLD_PREVIOUS_RELEASE
echo "== tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --all-features --locked --no-fail-fast
else
  # Without nextest's test groups (.config/nextest.toml), run the chaos runs one at a time.
  cargo test --workspace --all-features --locked --no-fail-fast --lib --bins --tests -- \
    --skip chaos_sqlite --skip chaos_redis --skip chaos_postgres --skip chaos_etcd \
    --skip chaos_mysql --skip chaos_valkey
  cargo test -p leasehold-cli --all-features --locked --test chaos -- --test-threads=1
fi
echo "== doc tests"
cargo test --workspace --all-features --locked --doc
echo "== sidecar API fuzzing (schemathesis, from the OpenAPI document)"
cargo build -p leasehold-cli --all-features --locked
bash scripts/fuzz-api.sh target/debug/leasehold
echo "== sidecar clients: TypeScript client, NestJS example end to end"
bash scripts/node-tests.sh target/debug/leasehold
echo "== sidecar clients: Python client, APScheduler and Celery beat replicas, the wheel"
bash scripts/python-tests.sh target/debug/leasehold
echo "== the sidecar's live page in a real browser (chromium, playwright-core)"
bash scripts/page-test.sh target/debug/leasehold
