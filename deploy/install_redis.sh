#!/usr/bin/env bash
# redis-server for the tests (the Redis state backend runs against a real one).
# `make run` does not need it: a single router keeps its state in memory.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  echo "[install] $(redis-server --version | cut -d' ' -f1-3) present"
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then sudo=(); elif command -v sudo >/dev/null 2>&1; then sudo=(sudo); else
  echo "[install] redis-server is missing and this user cannot install it: apt-get install redis-server" >&2
  exit 1
fi
echo "[install] redis-server (Debian package, for the state tests)"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends redis-server
# Debian's package starts a system service on 6379; the tests start their own on free ports.
redis-server --version
