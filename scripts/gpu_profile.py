"""Where a round's time goes on a GPU (issue 42): the profiler's view of the compiled steps and of a round.

    python scripts/gpu_profile.py --out DIR [--draft synthetic:qwen2.5-0.5b] [--target synthetic:qwen2.5-7b]

On the pair `specviz costs` measures (compiled steps, CUDA graphs of specviz's own), it writes DIR/profile.json
and DIR/profile.txt after each part, so a call cut off at its limit keeps what it had:
  steps     each model's one-token step, replayed back to back as a run drafts: wall time per step, kernels per
            step, GPU busy time and the gaps between kernels, the kernels by kind (matrix products, attention,
            inductor's fused kernels, copies) and the top kernels; the same compiled code launched kernel by
            kernel (no CUDA graph) beside it: what the graph saves
  round     the round loop at full acceptance (`bench/forced.py`, K = 4): its time per part, the GPU's busy
            share, runtime calls per round (graph launches, eager kernel launches, copies, syncs), the CPU ops
            by their own time, and Python's own functions by cProfile
  variants  the draft's and the target's step compiled with inductor options (freezing: constant weights, so
            q/k/v and gate/up become one product each; coordinate-descent tuning) against the same build without
Timings are medians after warm-up with the device synchronised; the profiler's and cProfile's shares are read
as shares (both slow what they watch).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specviz.bench.bandwidth import step_bound, triad_bandwidth  # noqa: E402
from specviz.compat import forward  # noqa: E402
from specviz.models.kernels import step_bytes  # noqa: E402

KINDS = (("gemm", ("gemm", "gemv", "cutlass", "nvjet", "sm90_", "sm100_", "cublas", "splitk", "ampere_")),
         ("attention", ("flash", "fmha", "attention", "efficient")),
         ("copy", ("memcpy", "memset", "copy", "cat")),
         ("triton (fused by inductor)", ("triton",)))


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, words in KINDS if any(w in low for w in words)), "other")


def trace_kernels(prof) -> tuple[list[tuple[float, float, str]], Counter]:
    """The device's kernels and copies (start µs, duration µs, name) and the CPU side's CUDA runtime calls."""
    path = f"/tmp/specviz-trace-{os.getpid()}.json"
    prof.export_chrome_trace(path)
    events = json.loads(Path(path).read_text())["traceEvents"]
    Path(path).unlink()
    kernels = sorted((e["ts"], e.get("dur", 0), e["name"]) for e in events
                     if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    runtime = Counter(e["name"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver"))
    return kernels, runtime


def timeline(kernels: list, per: int) -> dict:
    """Kernels per unit (a step, a round), the device's busy time and idle gaps per unit, kernels by kind."""
    if not kernels:
        return {"kernels": 0}
    busy, gaps, end = 0.0, [], None
    for ts, dur, _ in kernels:
        if end is None or ts >= end:
            if end is not None:
                gaps.append(ts - end)
            busy += dur
            end = ts + dur
        else:
            busy += max(0.0, ts + dur - end)
            end = max(end, ts + dur)
    span = end - kernels[0][0]
    by_name: dict[str, list[float]] = defaultdict(list)
    for _, dur, name in kernels:
        by_name[name].append(dur)
    total = sum(dur for _, dur, _ in kernels)
    kinds: dict[str, float] = defaultdict(float)
    counts: Counter = Counter()
    for name, durs in by_name.items():
        kinds[kind_of(name)] += sum(durs)
        counts[kind_of(name)] += len(durs)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:15]
    return {
        "kernels_per_unit": round(len(kernels) / per, 1),
        "span_us_per_unit": round(span / per, 1), "busy_us_per_unit": round(busy / per, 1),
        "busy_share": round(busy / span, 3),
        "gaps_us_per_unit": round(sum(gaps) / per, 1), "gap_median_us": round(statistics.median(gaps), 2) if gaps else 0,
        "gaps_over_5us_per_unit": round(sum(g > 5 for g in gaps) / per, 1),
        "kinds": {k: {"us_per_unit": round(v / per, 1), "share": round(v / total, 3),
                      "kernels_per_unit": round(counts[k] / per, 1)} for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
        "top": [{"name": name[:110], "kind": kind_of(name), "per_unit": round(len(d) / per, 2),
                 "mean_us": round(statistics.mean(d), 2), "us_per_unit": round(sum(d) / per, 1),
                 "share": round(sum(d) / total, 3)} for name, d in top],
    }


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def device_of(model) -> torch.device:
    return next(model.parameters()).device


def static_cache(model, prompt: list[int], room: int):
    """A static cache with the prompt read (as a run reads it), `room` tokens free after it."""
    cache = model.new_cache(len(prompt) + room)
    ids = torch.tensor([prompt], device=device_of(model))
    forward(model, ids, cache, 1)
    return cache


def steps_back_to_back(model, cache, n: int) -> None:
    """n one-token steps queued as a drafter queues them: no host read between them."""
    token = torch.ones((1, 1), dtype=torch.long, device=device_of(model))
    for _ in range(n):
        forward(model, token, cache, 1)
    cache.crop(-n)


def step_wall_ms(model, cache, n: int = 32, reps: int = 5) -> dict:
    """Milliseconds a step: back to back (n queued, one sync) and alone (a sync around each), medians."""
    steps_back_to_back(model, cache, 4)
    sync()
    queued, alone = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        steps_back_to_back(model, cache, n)
        sync()
        queued.append((time.perf_counter() - t0) / n)
    token = torch.ones((1, 1), dtype=torch.long, device=device_of(model))
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        forward(model, token, cache, 1)
        sync()
        alone.append(time.perf_counter() - t0)
        cache.crop(-1)
    return {"queued_ms": round(1e3 * statistics.median(queued), 4), "alone_ms": round(1e3 * statistics.median(alone), 4)}


def profiled(fn, n: int):
    from torch.profiler import ProfilerActivity, profile

    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        fn()
        sync()
    kernels, runtime = trace_kernels(prof)
    return prof, {**timeline(kernels, n), "runtime_calls_per_unit": {k: round(v / n, 2) for k, v in runtime.most_common(12)}}


def launched_one_by_one(model, cache, n: int):
    """The same compiled code as the graph, its kernels launched from Python (no CUDA graph): what a graph saves."""
    graphs = model.cuda_graphs
    token = torch.ones((1, 1), dtype=torch.long, device=device_of(model))
    marks = [layer.cumulative_length.clone() for layer in cache.hf.layers]

    def run():
        for _ in range(n):
            graphs.step(input_ids=token, **{graphs.cache_arg: cache.hf}, use_cache=True, logits_to_keep=1)
        for layer, mark in zip(cache.hf.layers, marks):
            layer.cumulative_length.copy_(mark)
    run()
    return run


def step_part(role: str, model, prompt, bandwidth: float) -> dict:
    n = 32
    cache = static_cache(model, prompt, 2 * n + 8)
    wall = step_wall_ms(model, cache, n)
    _, graphed = profiled(lambda: steps_back_to_back(model, cache, n), n)
    out = {"wall": wall, "bound": step_bound(step_bytes(model), bandwidth, wall["alone_ms"] / 1e3),
           "graphed": graphed}
    if getattr(model, "cuda_graphs", None) is not None:
        run = launched_one_by_one(model, cache, n)
        sync()
        t0 = time.perf_counter()
        run()
        sync()
        out["launched_ms"] = round(1e3 * (time.perf_counter() - t0) / n, 4)
        _, out["launched"] = profiled(run, n)
    print(f"{role}: {json.dumps({k: out[k] for k in ('wall', 'bound')})}", flush=True)
    return out


def round_part(pair, prompt: list[int], k: int, tokens: int) -> tuple[dict, str]:
    from specviz.bench.forced import KEEP_EVERY_DRAFT, ForcedDrafter
    from specviz.engine import DecodeConfig, autoregressive_generate, speculative_generate
    from specviz.engine.drafters import ModelDrafter
    from specviz.engine.sampling import SamplingParams, make_generator

    greedy = DecodeConfig(k=k, max_new_tokens=tokens + k + 1, adaptive="fixed")
    continuation = [s.token.id for s in autoregressive_generate(pair, prompt, greedy)]
    config = DecodeConfig(k=k, max_new_tokens=tokens, adaptive="fixed")

    def run() -> list:
        inner = ModelDrafter(pair.draft, SamplingParams(0.0), make_generator(pair.device, 0), pair.vocab_size)
        drafter = ForcedDrafter(inner, continuation, len(prompt), pair.vocab_size, pair.device)
        return list(speculative_generate(pair, prompt, config, drafter=drafter, rule=KEEP_EVERY_DRAFT))

    run()  # warm
    sync()
    t0 = time.perf_counter()
    rounds = run()
    wall = time.perf_counter() - t0
    timed = rounds[1:]
    per = lambda s: round(1e3 * s / len(timed), 3)  # noqa: E731
    # the first round's wall time includes reading the prompt: the rounds after it, as `forced_run` times them
    first = rounds[0].prefill_time + rounds[0].draft_time + rounds[0].verify_time + rounds[0].overhead_time
    out = {"k": k, "rounds": len(timed), "ms_per_round": per(wall - first),
           "draft_ms": per(sum(r.draft_time for r in timed)), "verify_ms": per(sum(r.verify_time for r in timed)),
           "event_ms": per(sum(r.overhead_time for r in timed))}
    prof, out["profile"] = profiled(run, len(rounds))
    cpu_ops = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60)
    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(35)
    stats.sort_stats("cumulative").print_stats(45)
    print(f"round: {json.dumps({k: v for k, v in out.items() if k != 'profile'})}", flush=True)
    return out, cpu_ops + "\n" + text.getvalue()


def variant(role: str, loaded_model, wide, prompt, patch: dict, bandwidth: float) -> dict:
    """`loaded_model`'s step compiled anew with inductor's options `patch` (dynamo's caches reset first, so it
    compiles, not reuses), timed and profiled as `step_part` does."""
    from specviz.models.compiled import with_compiled_step

    torch._dynamo.reset()
    t0 = time.perf_counter()
    with torch._inductor.config.patch(patch), torch.inference_mode():
        model = with_compiled_step(loaded_model, sizes=(512,), wide=wide)
        cache = static_cache(model, prompt, 80)
        steps_back_to_back(model, cache, 2)  # compiled, then recorded
        compile_s = time.perf_counter() - t0
        wall = step_wall_ms(model, cache, 32)
        _, graphed = profiled(lambda: steps_back_to_back(model, cache, 16), 16)
    result = {"patch": patch, "compile_s": round(compile_s, 1), "wall": wall,
              "bound": step_bound(step_bytes(loaded_model), bandwidth, wall["alone_ms"] / 1e3),
              "kernels_per_step": graphed.get("kernels_per_unit"), "kinds": graphed.get("kinds"),
              "top": graphed.get("top", [])[:6]}
    print(f"variant {role} {patch}: {json.dumps({k: result[k] for k in ('compile_s', 'wall', 'kernels_per_step')})}",
          flush=True)
    return result


def variants(loaded, eager, prompt: list[int], bandwidth: float, deadline: float):
    """Each inductor option's step (`variant`), as it is measured; those not started by `deadline` skipped."""
    from specviz.models.steps import wide_model

    big = wide_model(loaded.target, eager.target)
    runs = [("draft", loaded.draft, None, {}), ("draft", loaded.draft, None, {"freezing": True}),
            ("draft", loaded.draft, None, {"coordinate_descent_tuning": True}),
            ("target", loaded.target, big, {}), ("target", loaded.target, big, {"freezing": True})]
    for role, model, wide, patch in runs:
        if time.perf_counter() > deadline:
            yield {"role": role, "patch": patch, "skipped": "out of time"}
            continue
        try:
            yield {"role": role, **variant(role, model, wide, prompt, patch, bandwidth)}
        except Exception as e:  # noqa: BLE001 - a variant that fails is recorded; the next still runs
            yield {"role": role, "patch": patch, "error": f"{type(e).__name__}: {e}"[:400]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--draft", default="synthetic:qwen2.5-0.5b")
    parser.add_argument("--target", default="synthetic:qwen2.5-7b")
    parser.add_argument("--parts", default="steps,round,variants")
    parser.add_argument("--device", default="cuda", help="cpu: a rehearsal with the mini shapes")
    parser.add_argument("--budget-s", type=float, default=300, help="skip the variants not started by then")
    args = parser.parse_args()
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch._inductor.config.triton.unique_kernel_names = True  # names that say what each fused kernel does

    from specviz.bench.meta import machine
    from specviz.models import PairSpec
    from specviz.models.loading import load_pair, with_speedups
    from specviz.models.steps import with_steps
    from specviz.models.synthetic import prompt_ids
    from specviz.settings.spec import validate

    spec = validate(PairSpec, {"draft": args.draft, "target": args.target, "device": args.device,
                               "dtype": "bfloat16", "step": "eager"})
    loaded = load_pair(spec.draft, spec.target, device=args.device, dtype="bfloat16", status=print)
    eager = with_speedups(loaded, spec, print)
    pair = with_steps(loaded, eager, replace(spec, step="compiled"), print)
    prompt = prompt_ids(128, min(len(loaded.tokenizer), loaded.vocab_size))
    bandwidth = triad_bandwidth(device=loaded.device)
    report = {"machine": machine(), "bandwidth_gb_s": round(bandwidth / 1e9, 1),
              "pair": f"{args.draft} -> {args.target}", "dtype": "bfloat16", "context": len(prompt)}
    texts = []

    def save() -> None:
        (out / "profile.json").write_text(json.dumps(report, indent=1))
        (out / "profile.txt").write_text("\n\n".join(texts))

    parts = args.parts.split(",")
    with torch.inference_mode():
        if "steps" in parts:
            report["steps"] = {role: step_part(role, getattr(pair, role), prompt, bandwidth)
                               for role in ("draft", "target")}
            save()
        if "round" in parts:
            for k in (4, 8):
                report[f"round_k{k}"], text = round_part(pair, prompt, k, 64)
                texts.append(f"== round at full acceptance, K = {k}: CPU ops by their own time, then cProfile\n{text}")
                save()
    if "variants" in parts:
        report["variants"] = []
        for result in variants(loaded, eager, prompt, bandwidth, deadline=start + args.budget_s):
            report["variants"].append(result)
            save()
    report["seconds"] = round(time.perf_counter() - start, 1)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
