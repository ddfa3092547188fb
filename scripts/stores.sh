#!/usr/bin/env bash
# Makes sure the stores the tests need answer on loopback: Redis on 6379, PostgreSQL on 5432
# (trust auth, database `test`) and MariaDB on 3306 (root without a password from 127.0.0.1,
# database `test`). Starts them if they are installed but stopped; installs them from Debian's
# packages on a bare machine. Idempotent.
set -euo pipefail

log() { printf 'stores: %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=""
apt_install() {
  if [ -z "$apt_updated" ]; then as_root apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
ensure_redis() {
  if command -v redis-cli >/dev/null && redis_up; then return; fi
  if ! command -v redis-server >/dev/null; then log "installing redis-server"; apt_install redis-server redis-tools; fi
  log "starting redis-server on 127.0.0.1:6379"
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /tmp --logfile /tmp/leasehold-redis.log
  for _ in $(seq 50); do redis_up && return; sleep 0.1; done
  log "redis did not come up"; exit 1
}

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
psql_pg() { psql -h 127.0.0.1 -p 5432 -U postgres -qtAX "$@"; }
ensure_postgres() {
  if ! command -v pg_ctlcluster >/dev/null; then
    log "installing postgresql"; apt_install postgresql postgresql-client
  fi
  if ! pg_up; then
    local version; version=$(ls /etc/postgresql | sort -V | tail -1)
    local hba="/etc/postgresql/$version/main/pg_hba.conf"
    # A fresh install asks for passwords on TCP; the tests connect as postgres with trust auth.
    if ! grep -qE '^host\s+all\s+all\s+127\.0\.0\.1/32\s+trust' "$hba"; then
      log "allowing trust auth on loopback in $hba"
      as_root sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    fi
    log "starting PostgreSQL $version"
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    for _ in $(seq 100); do pg_up && break; sleep 0.1; done
    pg_up || { log "PostgreSQL did not come up"; exit 1; }
  fi
  if ! psql_pg -d postgres -c "select 1" >/dev/null 2>&1; then
    log "cannot connect as postgres over TCP; check pg_hba.conf trust for 127.0.0.1"; exit 1
  fi
  if [ "$(psql_pg -d postgres -c "select 1 from pg_database where datname = 'test'")" != 1 ]; then
    log "creating database test"; psql_pg -d postgres -c "create database test"
  fi
}

mysql_up() { mariadb --protocol=tcp -h 127.0.0.1 -P 3306 -u root -e "select 1" >/dev/null 2>&1; }
mysql_socket() { as_root mariadb --protocol=socket -u root "$@"; }
start_mariadb() {
  as_root mkdir -p /run/mysqld
  as_root chown mysql:mysql /run/mysqld
  if [ ! -d /var/lib/mysql/mysql ]; then
    log "creating the MariaDB data directory"
    as_root mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
  fi
  log "starting mariadbd on 127.0.0.1:3306"
  as_root setsid mariadbd --user=mysql --datadir=/var/lib/mysql --bind-address=127.0.0.1 \
    --port=3306 --skip-name-resolve --socket=/run/mysqld/mysqld.sock \
    --pid-file=/run/mysqld/mysqld.pid --log-error=/tmp/leasehold-mariadb.log \
    </dev/null >/dev/null 2>&1 &
  for _ in $(seq 150); do
    as_root mariadb-admin --protocol=socket ping >/dev/null 2>&1 && return
    sleep 0.1
  done
  log "MariaDB did not come up (see /tmp/leasehold-mariadb.log)"; exit 1
}
ensure_mysql() {
  # The chaos harness runs mariadbd and mariadb-install-db of its own; the tests use the client.
  if ! command -v mariadbd >/dev/null || ! command -v mariadb >/dev/null; then
    log "installing mariadb-server"; apt_install mariadb-server mariadb-client
  fi
  if ! mysql_up; then
    if ! as_root mariadb-admin --protocol=socket ping >/dev/null 2>&1; then start_mariadb; fi
    # Debian's root logs in through the Unix socket only; the tests connect over TCP.
    log "allowing root without a password from 127.0.0.1"
    mysql_socket -e "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY ''; \
      GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
    mysql_up || { log "cannot log in as root over TCP to 127.0.0.1:3306 (skip-name-resolve off?)"; exit 1; }
  fi
  mariadb --protocol=tcp -h 127.0.0.1 -P 3306 -u root -e "CREATE DATABASE IF NOT EXISTS test"
}

# The Redis TLS test makes its certificates with the openssl tool; the bundled SQLite is C.
ensure_tools() {
  if ! command -v openssl >/dev/null; then log "installing openssl"; apt_install openssl; fi
  if ! command -v cc >/dev/null; then log "installing a C compiler"; apt_install gcc libc6-dev; fi
  # The SQLite clock-step test runs a process with a stepped wall clock.
  if ! command -v faketime >/dev/null; then log "installing faketime"; apt_install faketime; fi
  # The etcd store's tests start clusters of their own from Debian's etcd-server.
  if ! command -v etcd >/dev/null; then log "installing etcd"; apt_install etcd-server; fi
  # Their failover test asks etcdctl which member leads.
  if ! command -v etcdctl >/dev/null; then log "installing etcdctl"; apt_install etcd-client; fi
  # The CLI's tests run leasehold under a lower descriptor limit (prlimit) and, as root, as
  # nobody (setpriv) so that a read-only SQLite file is read-only to it.
  if ! command -v prlimit >/dev/null || ! command -v setpriv >/dev/null; then
    log "installing util-linux"; apt_install util-linux
  fi
  # The metrics tests check scrapes and docs/alerts.yml with promtool (Debian's prometheus
  # package; only its promtool is used).
  if ! command -v promtool >/dev/null; then
    log "installing promtool"; apt_install --no-install-recommends prometheus
  fi
  # `leasehold completions` is checked by the shells themselves, `leasehold man` rendered by groff.
  for shell in zsh fish; do
    if ! command -v "$shell" >/dev/null; then log "installing $shell"; apt_install "$shell"; fi
  done
  if ! command -v groff >/dev/null; then log "installing groff"; apt_install groff-base; fi
  # The sidecar's TypeScript client and NestJS example (Node 20 or later).
  if ! command -v npm >/dev/null; then log "installing nodejs and npm"; apt_install nodejs npm; fi
  # The API fuzzer (schemathesis) and the cron differential test's oracle (croniter) are
  # installed from PyPI into virtualenvs.
  if ! python3 -c "import ensurepip, venv" 2>/dev/null; then
    log "installing python3-venv"; apt_install python3 python3-venv
  fi
}

ensure_redis
ensure_postgres
ensure_mysql
ensure_tools
log "redis, postgres and mariadb are up"
