#!/usr/bin/env bash
# What the test suite needs besides Python packages: PostgreSQL server binaries, the Spin model checker, node and npm,
# Postfix and Dovecot, Chromium and chromedriver.
# Idempotent and quick when both are present; installs with apt-get (root or passwordless sudo) otherwise.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bash "$here/install-postgres.sh" >/dev/null
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else SUDO=""; fi
if ! command -v spin >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
    echo "install-tools: spin is missing and there is no root to install it (apt-get install spin)" >&2; exit 1
  fi
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq spin
fi
# node and npm run json-server, the REST platform the HTTP tests publish to (installed by the test fixture)
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm
fi
# Postfix (SMTP) and Dovecot (IMAP), the email platform the email tests publish to (atmostonce_email/servers.py
# starts a throwaway instance of each on loopback). "No configuration": no system instance is set up or started.
if [ ! -x /usr/sbin/postfix ] || [ ! -x /usr/sbin/dovecot ] || ! dpkg -s dovecot-imapd >/dev/null 2>&1; then
  echo "postfix postfix/main_mailer_type select No configuration" | $SUDO debconf-set-selections
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postfix dovecot-imapd
fi
# headless Chromium and its WebDriver: the console's browser test (tests/console/test_browser.py) drives them
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver
fi
# etcd and Patroni: the PostgreSQL high-availability cluster of `make ha` (atmostonce_sql/hacluster.py starts a
# throwaway one on loopback; no system instance is set up or started)
if ! command -v etcd >/dev/null 2>&1 || ! command -v patroni >/dev/null 2>&1; then
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends etcd-server patroni
fi
# strace: the SQLite durability test (tests/test_sqlite_durability.py) watches the store's own system calls to see
# the WAL synced between the authorization's writes and the send
if ! command -v strace >/dev/null 2>&1; then
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq strace
fi
