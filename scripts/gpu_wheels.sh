#!/usr/bin/env bash
# The wheels a lent GPU machine lacks for specviz's engine, runs layer and tests (its image has torch, transformers,
# accelerate, tokenizers, scipy, pytest, httpx, prometheus-client, psutil, tqdm; not pydantic): downloaded here into
# .whl/ (ignored by git), for the device tool to carry. No network there, so nothing is fetched on that machine.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
platforms=()
for n in 2_28 2_27 2_17 2014 1; do
  case $n in 2014) platforms+=(--platform manylinux2014_x86_64) ;; 1) platforms+=(--platform manylinux1_x86_64) ;;
    *) platforms+=(--platform "manylinux_${n}_x86_64") ;; esac
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .whl pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 platformdirs==4.14.8
ls .whl
