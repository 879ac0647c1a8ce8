#!/usr/bin/env bash
# Make sure PostgreSQL server binaries (initdb, pg_ctl, postgres) and the `postgres` OS user exist.
#
# Idempotent: does nothing when they are already present. Otherwise installs Debian/Ubuntu's `postgresql`
# package with apt-get (needs root or passwordless sudo). Searches like atmostonce_sql.pgserver.find_pg_bin:
# $PG_BIN, `pg_config --bindir`, /usr/lib/postgresql/*/bin (highest version first), PATH.
# Prints the folder found on stdout (last line); exits non-zero with a message on stderr on failure.
set -euo pipefail

log() { echo "install-postgres: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

has_bins() {
  local d="$1"
  [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ]
}

find_pg_bin() {
  local d
  if [ -n "${PG_BIN:-}" ]; then
    if has_bins "$PG_BIN"; then echo "$PG_BIN"; return 0; fi
    return 1
  fi
  if command -v pg_config >/dev/null 2>&1; then
    d="$(pg_config --bindir 2>/dev/null || true)"
    if has_bins "$d"; then echo "$d"; return 0; fi
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5 -rV); do
    if has_bins "$d"; then echo "$d"; return 0; fi
  done
  local IFS=:
  for d in $PATH; do
    if has_bins "$d"; then echo "$d"; return 0; fi
    if [ -L "$d/pg_ctl" ]; then
      local real
      real="$(dirname "$(readlink -f "$d/pg_ctl")")"
      if has_bins "$real"; then echo "$real"; return 0; fi
    fi
  done
  return 1
}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo -n "$@"
  else
    die "need root (or sudo) to run: $*"
  fi
}

if [ -n "${PG_BIN:-}" ] && ! has_bins "$PG_BIN"; then
  die "\$PG_BIN=$PG_BIN does not contain initdb, pg_ctl and postgres"
fi

if ! bindir="$(find_pg_bin)"; then
  log "PostgreSQL server binaries not found; installing the 'postgresql' package with apt-get"
  command -v apt-get >/dev/null 2>&1 || die "apt-get not available; install PostgreSQL server binaries and set \$PG_BIN"
  as_root apt-get update -qq || die "apt-get update failed"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2 \
    || die "apt-get install postgresql failed"
  bindir="$(find_pg_bin)" || die "installed 'postgresql' but initdb/pg_ctl/postgres are still not found"
fi

if ! id -u postgres >/dev/null 2>&1; then
  log "creating the 'postgres' OS user"
  if command -v useradd >/dev/null 2>&1; then
    as_root useradd --system --user-group --home-dir /var/lib/postgresql --shell /bin/bash postgres \
      || die "could not create the 'postgres' OS user"
  elif command -v adduser >/dev/null 2>&1; then
    as_root adduser --system --group --home /var/lib/postgresql --shell /bin/bash postgres \
      || die "could not create the 'postgres' OS user"
  else
    die "no useradd/adduser to create the 'postgres' OS user"
  fi
fi
[ "$(id -u postgres)" -ne 0 ] || die "the 'postgres' OS user has uid 0; PostgreSQL refuses to run as root"

log "using $("$bindir/postgres" --version) from $bindir (OS user postgres, uid $(id -u postgres))"
echo "$bindir"
