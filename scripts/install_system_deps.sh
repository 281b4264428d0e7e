#!/usr/bin/env bash
# Debian packages that the operations tests drive: headless Chromium + ChromeDriver (the web UI
# test) and PostgreSQL (the PostgreSQL instance profile test). Installed when missing and running
# as root; otherwise their tests skip, with the reason, and this script says which are missing.
set -euo pipefail
need=()
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
((${#need[@]})) || exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
else
  echo "missing Debian packages (their tests will skip): ${need[*]}" >&2
fi
