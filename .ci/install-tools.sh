#!/usr/bin/env bash
# What the test suite needs besides Python packages: PostgreSQL server binaries and the Spin model checker.
# Idempotent and quick when both are present; installs with apt-get (root or passwordless sudo) otherwise.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bash "$here/install-postgres.sh" >/dev/null
if ! command -v spin >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
    echo "install-tools: spin is missing and there is no root to install it (apt-get install spin)" >&2; exit 1
  fi
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq spin
fi
