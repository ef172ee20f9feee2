#!/usr/bin/env bash
# The wheels a lent GPU machine lacks for specviz's engine, runs layer and tests (its image has torch, transformers,
# accelerate, tokenizers, scipy, pytest, httpx, prometheus-client, psutil, tqdm; not pydantic): downloaded here into
# .whl/ (ignored by git), for the device tool to carry. No network there, so nothing is fetched on that machine.
# `bash scripts/gpu_wheels.sh serve` adds what `specviz serve` and gradio_client need there (about 42 MB more: the
# gpu_check.sh `serve` stage), at the versions this project's venv runs.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
platforms=()
for n in 2_28 2_27 2_17 2014 1; do
  case $n in 2014) platforms+=(--platform manylinux2014_x86_64) ;; 1) platforms+=(--platform manylinux1_x86_64) ;;
    *) platforms+=(--platform "manylinux_${n}_x86_64") ;; esac
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .whl pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 platformdirs==4.14.8
if [[ ${1:-} == serve ]]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d .whl gradio==6.31.0 gradio_client==2.7.2 plotly==7.1.0 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 \
    brotli==1.2.1 groovy==0.1.2 hf-gradio==0.4.1 orjson==3.13.0 pydub==0.25.1 python-multipart==0.0.34 \
    pytz==2026.6 safehttpx==0.1.7 semantic-version==2.10.0 tomlkit==0.14.0 opentelemetry-api==1.45.2
fi
ls .whl
