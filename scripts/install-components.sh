#!/usr/bin/env bash
# Installs the real components the `components` tests start on loopback: redis-server and haproxy,
# from the system's packages, only when they are missing (so running it twice costs nothing).
# Also chromium (the page of recent decisions, opened headless), jq (the log one-liners of docs/operations.md)
# and curl (examples/curl.sh, run by tests/server/process/test_examples_and_serve.py).
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
command -v chromium >/dev/null 2>&1 || missing+=(chromium fonts-dejavu-core)  # a font, or the screenshot shows boxes
command -v jq >/dev/null 2>&1 || missing+=(jq)
command -v curl >/dev/null 2>&1 || missing+=(curl)
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-components: redis-server, haproxy, chromium, jq and curl are installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-components: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The packages start system services; the tests run their own instances on ports they choose.
for service in redis-server haproxy; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$service" 2>/dev/null; then
    $SUDO systemctl stop "$service" || true
  fi
done
redis-server --version
haproxy -v | sed -n 1p  # sed reads to the end: head would close the pipe early and, under pipefail, fail the script with SIGPIPE (141)
chromium --version
jq --version
curl --version | head -n 1
