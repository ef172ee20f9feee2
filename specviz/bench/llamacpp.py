"""`specviz bench --compare-llamacpp DIR`: llama.cpp on the same GGUF files, prompts and settings.

On a CPU, llama.cpp is the engine a user would actually run, so its numbers are the honest peer for specviz's:
its target-alone decode rate is what specviz's target-alone lane has to be read against, and its own
speculative speedup (with the same draft, K and sampling) is what specviz's speculative lane competes with.
Measured, with the binaries of a llama.cpp build folder (scripts/build_llamacpp.sh makes one):

* each model alone: `llama-bench -p 0 -n N -r 3 -o json`, the median of its repetitions' token-generation
  rates (`samples_ts`; no prompt; llama-bench warms up first);
* speculative decoding, once per prompt: `llama-speculative-simple` with the target, the draft, K as the most
  tokens drafted per round and the chosen setting's confidence cut as its `p_min` (the same rule: stop drafting
  when the draft's top probability falls below it). We use the *decode* time and token count it reports
  ("decoded N tokens in S seconds"), which exclude prompt processing, so the rate compares with llama-bench's
  token-generation rate. Aggregates are ratios of totals over prompts (sum tokens / sum seconds; sum accepted /
  sum drafted), as specviz's own are.

The prompts get the target's chat template here, as specviz gives them (`prompting.encode_prompt`), and go to
llama.cpp as text with special tokens parsed; llama.cpp adds a BOS itself when the GGUF asks for one, so a BOS
the template writes is dropped to avoid a double one.

The parsers are pure functions of the text the binaries print (their output changes between versions: parse
defensively, fail with one sentence); the subprocess calls go through an injectable `run`.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specviz.bench.noise import stall_between, stall_seconds
from specviz.remote.llama_server import flag_names, has_flag
from specviz.remote.policy import EngineError

PREFIX = "specviz bench: --compare-llamacpp:"
BINARIES = ("llama-bench", "llama-speculative-simple")  # (llama-server is built too, but not run here)
REPETITIONS = 3
TIMEOUT_S = 1800  # one command; a contended 2-core machine decodes a 1.5B model at under 1 token/s

Run = Callable[..., subprocess.CompletedProcess]


class LlamaCppOutputError(ValueError):
    """A llama.cpp binary printed something we could not read numbers from; the message is one sentence."""


# ---------------------------------------------------------------------------------------------- parsers


def parse_bench_json(text: str) -> float:
    """Tokens per second of llama-bench's token-generation test (`-p 0 -n N -o json`): its `avg_ts`."""
    return bench_record(text)["avg_ts"]


def bench_record(text: str) -> dict:
    """The token-generation entry of llama-bench's JSON: its mean rate, spread and samples (tokens/s)."""
    try:
        entries = json.loads(text[text.index("["):text.rindex("]") + 1])  # (any log line around the array)
    except ValueError:
        raise LlamaCppOutputError("llama-bench printed no JSON array of results (was it run with -o json?).") from None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("n_gen", 0) > 0 and not entry.get("n_prompt") \
                and isinstance(entry.get("avg_ts"), (int, float)):
            samples = [x for x in entry.get("samples_ts") or [] if isinstance(x, (int, float))]
            return {"avg_ts": float(entry["avg_ts"]), "stddev_ts": entry.get("stddev_ts"),
                    # the median: one repetition disturbed by another process does not move it
                    "median_ts": float(statistics.median(samples)) if samples else float(entry["avg_ts"]),
                    "samples_ts": entry.get("samples_ts"), "n_gen": entry["n_gen"],
                    "build_commit": entry.get("build_commit"), "build_number": entry.get("build_number")}
    raise LlamaCppOutputError("llama-bench's JSON has no token-generation result (n_prompt 0, n_gen > 0, avg_ts).")


_NUMBER = r"([0-9]+(?:\.[0-9]*)?|inf|nan)"
_DECODED = re.compile(rf"decoded\s+(\d+)\s+tokens\s+in\s+{_NUMBER}\s+seconds")
_ENCODED = re.compile(rf"encoded\s+(\d+)\s+tokens\s+in\s+{_NUMBER}\s+seconds")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")


def _last(pattern: re.Pattern, text: str):
    """The last match: the summary comes after the generated text, which could contain anything."""
    found = pattern.findall(text)
    return found[-1] if found else None


def parse_speculative(text: str) -> dict:
    """llama-speculative-simple's summary: decoded tokens and seconds (prompt processing excluded), prompt tokens
    and seconds, tokens drafted and accepted."""
    decoded, drafted, accepted = _last(_DECODED, text), _last(_DRAFTED, text), _last(_ACCEPTED, text)
    missing = [name for name, v in (("'decoded N tokens in S seconds'", decoded), ("n_drafted", drafted),
                                    ("n_accept", accepted)) if v is None]
    if missing:
        raise LlamaCppOutputError(f"llama-speculative-simple's output has no {' or '.join(missing)} "
                                  "(a version whose summary specviz cannot read).")
    tokens, seconds = int(decoded[0]), float(decoded[1])
    if not seconds > 0:
        raise LlamaCppOutputError(f"llama-speculative-simple reported {tokens} tokens decoded in {decoded[1]} s.")
    encoded = _last(_ENCODED, text)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "drafted": int(drafted), "accepted": int(accepted),
            "prompt_tokens": int(encoded[0]) if encoded else None,
            "prompt_seconds": float(encoded[1]) if encoded else None}


def parse_version(text: str) -> str | None:
    """'0.5.0-dev, build 0, commit unknown' from `--version`'s 'version: 0.5.0-dev (build 0, commit unknown)'."""
    m = re.search(r"version:\s*(\S+)(?:\s*\(build\s*(\d+),\s*commit\s*([^)\s]+)\))?", text)
    if not m:
        return None
    return m[1] + (f", build {m[2]}, commit {m[3]}" if m[2] else "")


def speculative_flags(help_text: str) -> dict:
    """The names this llama-speculative-simple accepts (`remote.llama_server.flag_names`), and --no-escape."""
    try:
        flags = flag_names(help_text, "llama-speculative-simple")
    except EngineError as e:
        raise LlamaCppOutputError(str(e)) from None
    # the prompt carries the template's newlines as text: llama.cpp must not rewrite '\n' sequences in it
    flags["no_escape"] = ["--no-escape"] if has_flag(help_text, "--no-escape") else []
    return flags


# ---------------------------------------------------------------------------------------------- inputs


def binaries(folder: str | Path) -> Path:
    """The folder holding the binaries: DIR/bin (a cmake build folder) or DIR itself."""
    folder = Path(folder).expanduser()
    for where in (folder / "bin", folder):
        if all((where / b).is_file() for b in BINARIES):
            return where
    missing = [b for b in BINARIES if not (folder / "bin" / b).is_file() and not (folder / b).is_file()]
    raise SystemExit(f"{PREFIX} {folder} has no {' or '.join(missing)} (in it or in its bin/); "
                     "scripts/build_llamacpp.sh builds them and prints the folder to pass.")


def gguf_file(source: str | None, role: str) -> Path:
    """The GGUF file behind a model source: the embedded pair's verified file, or a FILE.gguf given."""
    from specviz.models.embedded import EmbeddedModelError, assemble, embedded_model

    if (embedded := embedded_model(source, role)) is not None:
        try:
            return assemble(embedded, progress=False)
        except EmbeddedModelError as e:
            raise SystemExit(f"{PREFIX} {e}") from None
    if source is not None and source.lower().endswith(".gguf"):
        path = Path(source).expanduser()
        if not path.is_file():
            raise SystemExit(f"{PREFIX} the {role} GGUF file {path} does not exist.")
        return path
    raise SystemExit(f"{PREFIX} llama.cpp needs GGUF files, but the {role} is {source or 'none'!r}; use the "
                     "embedded pair or --draft/--target FILE.gguf.")


def chat_text(tokenizer, prompt: str) -> str:
    """The prompt as specviz encodes it (`prompting.encode_prompt`), as text: the chat template when the tokenizer
    has one, without a leading BOS (llama.cpp adds its own when the GGUF asks for one)."""
    if not getattr(tokenizer, "chat_template", None):
        return prompt
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         tokenize=False)
    bos = getattr(tokenizer, "bos_token", None)
    return text[len(bos):] if bos and text.startswith(bos) else text


def target_tokenizer(source: str | None, gguf: Path):
    """The target's tokenizer, for its chat template: the embedded model's converted copy when the cache has one
    (what specviz itself loaded), else read from the GGUF file by transformers."""
    import torch
    from transformers import AutoTokenizer

    from specviz.models.embedded import converted_dir, embedded_model, is_converted

    embedded = embedded_model(source, "target")
    for dtype in (None, torch.bfloat16) if embedded is not None else ():
        if is_converted(embedded, dtype):  # (every copy has the same tokenizer)
            return AutoTokenizer.from_pretrained(converted_dir(embedded, dtype))
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def sampling_args(config) -> list[str]:
    """specviz's warps in llama.cpp's flags: --temp 0 is its argmax; otherwise temperature, top-k and top-p as set
    (0 and 1 are 'off' in both) and min-p off (llama.cpp's default 0.05 is a warp specviz does not apply)."""
    s = config.sampling
    args = ["--temp", "0"] if s.greedy else ["--temp", f"{s.temperature:g}", "--top-k", str(s.top_k),
                                             "--top-p", f"{s.top_p:g}", "--min-p", "0"]
    return args + (["--seed", str(config.seed)] if config.seed is not None else [])


# ---------------------------------------------------------------------------------------------- runs


def _call(run: Run, cmd: list[str]) -> tuple[subprocess.CompletedProcess, float | None]:
    """Run one binary; return its result and the CPU stall meanwhile (a busy neighbour slows llama.cpp too)."""
    s0, t0 = stall_seconds(), time.perf_counter()
    try:
        done = run(cmd, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S, check=True)
    except subprocess.CalledProcessError as e:
        last = next((line.strip() for line in reversed(f"{e.stdout or ''}\n{e.stderr or ''}".splitlines())
                     if line.strip()), "no output")
        raise SystemExit(f"{PREFIX} {Path(cmd[0]).name} failed (exit status {e.returncode}): "
                         f"{last.rstrip('.')}.") from None
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{PREFIX} {Path(cmd[0]).name} ran past {TIMEOUT_S} s and was stopped.") from None
    except OSError as e:
        raise SystemExit(f"{PREFIX} could not run {cmd[0]}: {e.strerror or e}.") from None
    return done, stall_between(s0, stall_seconds(), time.perf_counter() - t0)


def _read(parse, text: str):
    try:
        return parse(text)
    except LlamaCppOutputError as e:
        raise SystemExit(f"{PREFIX} {e}") from None


def _help_text(run: Run, binary: str) -> str:
    done, _ = _call(run, [binary, "--help"])
    return f"{done.stdout}\n{done.stderr}"


def _ratio(a, b):
    return a / b if a is not None and b else None


@dataclass(frozen=True)
class Build:
    """How llama.cpp runs here: the build's binaries, the threads each run takes, the runner (`subprocess.run`, or
    a test's fake) and where progress goes."""

    bin_dir: Path
    threads: int
    run: Run
    status: Callable[[str], None]

    @property
    def bench(self) -> str:
        return str(self.bin_dir / "llama-bench")

    @property
    def speculative(self) -> str:
        return str(self.bin_dir / "llama-speculative-simple")



def build_name(llama: Build) -> str:
    """The build folder (DIR for DIR/bin) and its version (`--version`), as the report names it."""
    done, _ = _call(llama.run, [llama.bench, "--version"])
    version = parse_version(f"{done.stdout}\n{done.stderr}")
    return f"{llama.bin_dir.parent if llama.bin_dir.name == 'bin' else llama.bin_dir}" \
        + (f", version {version}" if version else "")


def alone(llama: Build, files: dict[str, Path], config, commands: list[str]) -> dict[str, dict]:
    """Each model alone: llama-bench's token-generation rate (median of its repetitions) and the CPU stall."""
    out = {}
    for role in ("target", "draft"):
        cmd = [llama.bench, "-m", str(files[role]), "-p", "0", "-n", str(config.max_new_tokens),
               "-t", str(llama.threads), "-r", str(REPETITIONS), "-o", "json"]
        llama.status(f"llama.cpp: the {role} alone, llama-bench ({config.max_new_tokens} tokens x {REPETITIONS})…")
        commands.append(shlex.join(cmd))
        done, stall = _call(llama.run, cmd)
        out[role] = {**_read(bench_record, done.stdout), "stall": stall}
    return out


def speculative_runs(llama: Build, files: dict[str, Path], flags: dict, prompts, config, chat: Callable[[str], str],
                     commands: list[str]) -> list[dict]:
    """Speculative decoding on each prompt (llama-speculative-simple) at `config`'s K, cut, length and sampling."""
    p_min = config.stop_below  # the 'confidence' mode's cut; 0 = draft all K in the other modes
    runs = []
    for i, prompt in enumerate(prompts, start=1):
        cmd = [llama.speculative, "-m", str(files["target"]), "-md", str(files["draft"]), "-p", chat(prompt.prompt),
               *flags["no_escape"], "-n", str(config.max_new_tokens), *flags["type"], flags["n_max"], str(config.k),
               *([flags["n_min"], "0"] if flags["n_min"] else []),
               *([flags["p_min"], f"{p_min:g}"] if flags["p_min"] else []),
               *sampling_args(config), "-t", str(llama.threads)]
        llama.status(f"llama.cpp: speculative decoding, prompt {i}/{len(prompts)} ({prompt.id})…")
        commands.append(shlex.join(cmd))
        done, stall = _call(llama.run, cmd)
        out = _read(parse_speculative, f"{done.stdout}\n{done.stderr}")  # (the summary is logged to stderr)
        runs.append({"id": prompt.id, "kind": prompt.kind, **out, "stall": stall})
    return runs


def totals(alone_rates: dict[str, dict], runs: list[dict], config) -> dict:
    """The comparison's numbers: each model's rate, c, and the speculative rate and acceptance as ratios of totals
    over the prompts (sum tokens / sum seconds; sum accepted / sum drafted)."""
    target_tps, draft_tps = alone_rates["target"]["median_ts"], alone_rates["draft"]["median_ts"]
    spec_tps = _ratio(sum(r["tokens"] for r in runs), sum(r["seconds"] for r in runs))
    stalls = [s for s in [*(a["stall"] for a in alone_rates.values()), *(r["stall"] for r in runs)] if s is not None]
    return {"target_tokens_per_s": target_tps, "draft_tokens_per_s": draft_tps,
            "c": _ratio(target_tps, draft_tps),  # draft step / target step
            "k": config.k, "p_min": config.stop_below, "max_new_tokens": config.max_new_tokens,
            "greedy": config.sampling.greedy, "spec_tokens_per_s": spec_tps,
            "spec_over_target": _ratio(spec_tps, target_tps),
            "acceptance": _ratio(sum(r["accepted"] for r in runs), sum(r["drafted"] for r in runs)),
            "prompts": len(runs), "runs": runs, "alone": alone_rates, "max_stall": max(stalls) if stalls else None}


def compare_llamacpp(folder: str | Path, spec, prompts, config, *, status: Callable[[str], None] = lambda s: None,
                     run: Run = subprocess.run, threads: int | None = None,
                     chat: Callable[[str], str] | None = None) -> dict:
    """Time llama.cpp on `spec`'s GGUF files: each model alone (llama-bench), then speculative decoding on each
    prompt (llama-speculative-simple) at `config`'s K, length and sampling. `chat` turns a prompt into the text
    llama.cpp gets (default: the target's chat template); `threads` defaults to torch's."""
    bin_dir = binaries(folder)
    files = {"target": gguf_file(spec.target, "target"), "draft": gguf_file(spec.draft, "draft")}
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    if chat is None:
        tokenizer = target_tokenizer(spec.target, files["target"])
        chat = lambda prompt: chat_text(tokenizer, prompt)  # noqa: E731
    llama, commands = Build(bin_dir, threads, run, status), []
    name = build_name(llama)
    flags = _read(speculative_flags, _help_text(run, llama.speculative))
    rates = alone(llama, files, config, commands)
    runs = speculative_runs(llama, files, flags, prompts, config, chat, commands)
    return {"build": name, "threads": threads, **totals(rates, runs, config),
            "files": {role: str(path) for role, path in files.items()}, "commands": commands}
