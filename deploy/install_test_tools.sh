#!/usr/bin/env bash
# What the tests run besides Python, from Debian packages:
# - redis-server: the Redis state backend is tested against a real one;
# - promtool (package prometheus): the alert rules in deploy/prometheus are tested with it.
# `make run` needs neither: a single router keeps its state in memory.
set -euo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ ${#missing[@]} -eq 0 ]; then
  echo "[install] $(redis-server --version | cut -d' ' -f1-3), $(promtool --version 2>&1 | head -1) present"
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then sudo=(); elif command -v sudo >/dev/null 2>&1; then sudo=(sudo); else
  echo "[install] missing ${missing[*]} and this user cannot install them: apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "[install] ${missing[*]} (Debian packages, for the tests)"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
# Debian's packages may start system services (6379, 9090); the tests start their own.
redis-server --version
promtool --version 2>&1 | head -1
