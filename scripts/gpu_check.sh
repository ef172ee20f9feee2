#!/usr/bin/env bash
# The GPU measurements and CUDA tests, on a lent GPU machine (the device tool), one stage a call: each stage runs under
# `timeout 540` (a call may take 10 minutes), writes what it has as it goes (the costs JSON after each step mode, a
# failing mode recorded while the next runs), and leaves at most 8 files under $OUT in all. The plan, inside 30
# minutes of GPU time with a machine's start (a few minutes) per call:
#   here, once:  bash scripts/gpu_wheels.sh                  (the wheels that machine lacks, into .whl/)
#   here, too:   python scripts/triton_compile.py --arch 90   (the Triton kernels compile for the GPU: no GPU needed)
#   call 1:      carry [".whl"], command "bash scripts/gpu_check.sh costs"          (~6 min: two compiles, the curve)
#   call 2:      "bash scripts/gpu_check.sh tests-float32 race"                     (~5 min)
#   call 3:      "bash scripts/gpu_check.sh tests-bfloat16"                         (~4 min)
# Stages:
#   costs           specviz costs: the 7B-shape target with the 0.5B-shape draft in bf16, eager and compiled (T1, the
#                   verify curve to 32, c, the bound, predicted speedups, the loop at full acceptance)
#   costs-1.5b      the same with the 1.5B-shape target (the embedded pair's shapes)
#   tests-float32   the engine's tests on CUDA in float32 (greedy identity, the statistical tests and their
#   tests-bfloat16  negative controls, trees, the mapped vocabulary, the compiled step, synthetic pairs through the
#                   runs layer) and tests/test_cuda.py (memory estimate, CUDA graphs); the same in bf16
#   tests-all       tests-float32, tests-bfloat16 and race at once (three pytest runs side by side)
#   race            the app's race through the runs layer, advanced from a thread pool as Gradio does, on the model
#                   thread, with a compiled step (CUDA graphs are per thread: this is where a second thread would
#                   break them)
#   profile         where a round's time goes (scripts/gpu_profile.py): the compiled steps' kernels and the gaps
#                   between them, a round's parts, runtime calls and Python (cProfile), inductor options A/B
#   invariant       the row-invariant verify on Triton (issue 73): tests/test_triton_rows.py on CUDA, `specviz rows`
#                   (17 rows, the 7B shape, bf16: every row's logits and K/V against the one-token steps), and
#                   `specviz costs` with the eager step (the target on the Triton kernels: T1 against the bound,
#                   T(n)/T1, c, the loop at full acceptance) (~6 min)
#   serve           `specviz serve` on the 0.5B -> 7B shapes on the device, a race asked through gradio_client from
#                   each of two threads one after the other (scripts/gpu_serve.py): both lanes to the end, the
#                   result kept (needs the serve wheels: bash scripts/gpu_wheels.sh serve)
# Tried on a CPU with the mini shapes: SPECVIZ_GPU_CHECK_DEVICE=cpu SPECVIZ_GPU_CHECK_SMALL=1 bash scripts/gpu_check.sh ...
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/specviz-gpu}; mkdir -p "$OUT"
device=${SPECVIZ_GPU_CHECK_DEVICE:-cuda}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SPECVIZ_CACHE=${SPECVIZ_CACHE:-/tmp/specviz-cache}
if compgen -G ".whl/*.whl" >/dev/null; then  # the device tool's way to bring what its image lacks
  [[ -e /tmp/site/.installed ]] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.installed; } || exit 1  # once: stages may run at once
  export PYTHONPATH=.:tests:/tmp/site
else
  export PYTHONPATH=.:tests
fi
python=${PYTHON:-python3}
{ date -u; nvidia-smi 2>/dev/null || echo "no nvidia-smi"; "$python" -c "import torch, transformers; print('torch',
  torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"; } | tee -a "$OUT/machine.txt"

costs() {  # $1: target shape, $2: report name
  local small=${SPECVIZ_GPU_CHECK_SMALL:-}
  local draft=${small:+synthetic:mini-draft}; draft=${draft:-synthetic:qwen2.5-0.5b}
  local target=${small:+synthetic:mini-target}; target=${target:-$1}
  timeout "${SPECVIZ_GPU_CHECK_TIMEOUT:-540}" "$python" -m specviz.commands.costs costs --draft "$draft" --target "$target" --device "$device" \
    --dtype bfloat16 --step "${SPECVIZ_GPU_CHECK_STEPS:-eager,compiled}" --max-verify 32 --forced-k 4,8 --forced-tokens 128 --json "$OUT/$2.json" 2>&1 \
    | tee "$OUT/$2.log"
}

pytests() {  # $1: dtype, $2: log name, the rest: test files
  local dtype=$1 log=$2; shift 2
  SPECVIZ_TEST_DEVICE=$device SPECVIZ_TEST_DTYPE=$dtype timeout "${SPECVIZ_GPU_CHECK_TIMEOUT:-540}" "$python" -m pytest -v --tb=short -ra -p no:cacheprovider -n 4 \
    --timeout 240 -o addopts="" "$@" 2>&1 | tee "$OUT/$log.log"
}

tests() {  # $1: dtype
  pytests "$1" "tests_$1" tests/test_speculative.py tests/test_statistical.py tests/test_families.py \
    tests/test_tree_round.py tests/test_compiled.py tests/test_synthetic.py tests/test_cuda.py
}

invariant() {
  local small=${SPECVIZ_GPU_CHECK_SMALL:-}
  local draft=${small:+synthetic:mini-draft}; draft=${draft:-synthetic:qwen2.5-0.5b}
  local target=${small:+synthetic:mini-target}; target=${target:-synthetic:qwen2.5-7b}
  pytests bfloat16 triton_rows tests/test_triton_rows.py || return 1
  timeout "${SPECVIZ_GPU_CHECK_TIMEOUT:-540}" "$python" -m specviz.commands.rows rows --draft "$draft" --target "$target" \
    --device "$device" --dtype bfloat16 --step eager --width 17 --tokens 64 --json "$OUT/rows_bf16.json" 2>&1 | tee "$OUT/rows.log"
  SPECVIZ_GPU_CHECK_STEPS=eager costs "$target" costs_invariant_bf16
  # torch 2.11's check of what a user's Triton kernel writes can fail on scalar arguments (then every input is
  # copied a call, or worse): said here, where the compiled CUDA test ran
  if grep -q "identify_mutated_tensors" "$OUT/triton_rows.log"; then
    echo "torch.compile could not tell what the Triton kernels write: see $OUT/triton_rows.log"; return 1
  fi
}

serve() {
  local small=${SPECVIZ_GPU_CHECK_SMALL:-}
  local draft=${small:+synthetic:mini-draft}; draft=${draft:-synthetic:qwen2.5-0.5b}
  local target=${small:+synthetic:mini-target}; target=${target:-synthetic:qwen2.5-7b}
  timeout "${SPECVIZ_GPU_CHECK_TIMEOUT:-540}" "$python" scripts/gpu_serve.py --draft "$draft" --target "$target" --device "$device" \
    --step "${SPECVIZ_GPU_CHECK_STEP:-compiled}" --json "$OUT/serve.json" --log "$OUT/serve_server.log" 2>&1 \
    | tee "$OUT/serve.log"
}

status=0
for stage in "$@"; do
  echo "== $stage"
  case $stage in
    costs) costs synthetic:qwen2.5-7b costs_7b_bf16 || status=1 ;;
    costs-1.5b) costs synthetic:qwen2.5-1.5b costs_1.5b_bf16 || status=1 ;;
    tests-float32) tests float32 || status=1 ;;
    tests-bfloat16) tests bfloat16 || status=1 ;;
    race) pytests bfloat16 race tests/test_model_thread.py || status=1 ;;
    tests-all)  # the three test stages at once (no timing in them): one call instead of three
      tests float32 >/dev/null & a=$!; tests bfloat16 >/dev/null & b=$!
      pytests bfloat16 race tests/test_model_thread.py >/dev/null & c=$!
      for p in $a $b $c; do wait $p || status=1; done
      tail -n 3 "$OUT"/tests_float32.log "$OUT"/tests_bfloat16.log "$OUT"/race.log ;;
    profile) timeout "${SPECVIZ_GPU_CHECK_TIMEOUT:-540}" "$python" scripts/gpu_profile.py --out "$OUT" --device "$device" \
      ${SPECVIZ_GPU_CHECK_SMALL:+--draft synthetic:mini-draft --target synthetic:mini-target} --budget-s "${SPECVIZ_GPU_PROFILE_BUDGET:-300}" \
      --parts "${SPECVIZ_GPU_PROFILE_PARTS:-steps,round,variants}" 2>&1 | tee "$OUT/profile.log" || status=1 ;;
    invariant) invariant || status=1 ;;
    serve) serve || status=1 ;;
    *) echo "unknown stage $stage"; status=2 ;;
  esac
done
exit $status
