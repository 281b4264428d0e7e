#!/usr/bin/env bash
# Debian packages that the operations tests drive: headless Chromium + ChromeDriver (the web UI
# test), PostgreSQL (the PostgreSQL instance profile test), a Java 17 runtime (the Spark engine,
# pyspark 4) and Node.js with npm (Azurite, the Azure Blob emulator). Installed when missing and running as root; otherwise this script says which are missing.
set -euo pipefail
need=()
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
# Node.js and npm: Azurite, the Azure Blob emulator of the object-storage tests (Makefile)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
# Spark 4 runs on Java 17 or 21; "java -version" prints e.g. openjdk version "17.0.15" (on stderr)
java_major=$(java -version 2>&1 | sed -n 's/.* version "\([0-9]*\).*/\1/p' | head -n1)
[[ "$java_major" == 17 || "$java_major" == 21 ]] || need+=(openjdk-17-jre-headless)
((${#need[@]})) || exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
else
  echo "missing Debian packages (their tests will skip): ${need[*]}" >&2
fi
