# Sourced by scripts/test and scripts/demo: makes sure the services inoutbox runs against exist.
# PostgreSQL: started if it is installed but down (and stopped again on exit by the caller's
# trap if this script started it). Tansu: installed from PyPI if missing.

STARTED_POSTGRES=0

ensure_postgres() {
  if ! command -v pg_lsclusters >/dev/null 2>&1; then
    echo "PostgreSQL is not installed; installing it with apt-get" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    echo "starting PostgreSQL $version" >&2
    pg_ctlcluster --skip-systemctl-redirect "$version" main start
    STARTED_POSTGRES=1
    for _ in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done
  fi
  pg_isready -q -h 127.0.0.1 -p 5432 || { echo "PostgreSQL did not come up on 127.0.0.1:5432" >&2; return 1; }
  # The tests and examples use database `test` as user `postgres`.
  if ! psql -h 127.0.0.1 -U postgres -d test -Atqc 'select 1' >/dev/null 2>&1; then
    psql -h 127.0.0.1 -U postgres -d postgres -qc 'CREATE DATABASE test' >/dev/null 2>&1 \
      || su postgres -c "createdb test" 2>/dev/null || true
  fi
  psql -h 127.0.0.1 -U postgres -d test -Atqc 'select 1' >/dev/null \
    || { echo "cannot connect as postgres to database test on 127.0.0.1:5432 (trust auth expected)" >&2; return 1; }
}

stop_postgres_if_started() {
  if [ "$STARTED_POSTGRES" = 1 ]; then
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    pg_ctlcluster --skip-systemctl-redirect "$version" main stop || true
  fi
}

ensure_tansu() {
  "$(dirname "${BASH_SOURCE[0]}")/install-tansu"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# NATS with JetStream: the NATS tests start their own `nats-server -js` processes (one per test,
# on a free port, with a store directory of their own); this only installs the server.
ensure_nats_server() {
  if ! command -v nats-server >/dev/null 2>&1; then
    echo "nats-server is not installed; installing it with apt-get" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >/dev/null
  fi
  command -v nats-server >/dev/null || { echo "nats-server could not be installed" >&2; return 1; }
}

# MariaDB for the MySQL/MariaDB store's tests: installed with apt-get when missing, started when
# down (left running: it is the machine's shared server), database `test` for root without a
# password over TCP. Each test creates a database of its own (`t_<name>_<random>`).
ensure_mariadb() {
  if ! command -v mariadb >/dev/null 2>&1 && ! command -v mysqld_safe >/dev/null 2>&1; then
    echo "MariaDB is not installed; installing it with apt-get" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server >/dev/null
  fi
  if ! mariadb -uroot -h 127.0.0.1 -e 'select 1' >/dev/null 2>&1; then
    echo "starting MariaDB" >&2
    service mariadb start >/dev/null 2>&1 || (mysqld_safe >/dev/null 2>&1 &)
    for _ in $(seq 1 100); do mariadb -uroot -h 127.0.0.1 -e 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
  fi
  mariadb -uroot -h 127.0.0.1 -e 'CREATE DATABASE IF NOT EXISTS test' >/dev/null 2>&1 \
    || { echo "cannot connect as root (no password) to MariaDB on 127.0.0.1:3306" >&2; return 1; }
}
