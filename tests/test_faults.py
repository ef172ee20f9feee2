"""Faults of the machine, not of the input: a cache that cannot be written (full, read-only) and two processes
writing one measurement at once. A measurement that cannot be kept serves the process that took it and says so
in one sentence; a failed write leaves nothing behind; a reader never sees half a file."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import threading

import pytest
import torch

from specviz.models import kernel_table
from specviz.models.auto_dtype import cpu_dtype_timings
from specviz.models.kernel_table import KernelKey, read_keyed, table_path, write_keyed
from specviz.models.kernels import tune
from specviz.models.tiny import tiny_pair

KEY = KernelKey.of(["shape"], torch.device("cpu"), [1, 2], cpu="a cpu")


@pytest.fixture
def failing_writes(monkeypatch):
    """Every write of a kept measurement fails as a full (or read-only) disk makes it fail: at its first byte."""
    def fail(code):
        def fdopen(fd, *args, **kwargs):
            os.close(fd)
            raise OSError(code, os.strerror(code))
        monkeypatch.setattr(kernel_table.os, "fdopen", fdopen)
    return fail


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS], ids=["full", "read-only"])
def test_kernel_tuning_on_a_cache_it_cannot_write_runs_and_says_so_once(tmp_path, failing_writes, caplog, code):
    failing_writes(code)
    with caplog.at_level(logging.WARNING):
        model, tuning = tune(tiny_pair().target, folder=tmp_path)
    assert tuning.plans and not tuning.cached  # measured, and used, for this process
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("The kernel timings could not be saved to ")
    assert f"({os.strerror(code)})" in warnings[0] and "measured again at the next start" in warnings[0]
    assert not [p for p in tmp_path.rglob("*") if p.suffix in (".json", ".tmp")]  # no partial file left


def test_the_dtype_choice_on_a_full_cache_is_measured_and_used(tmp_path, failing_writes, caplog):
    failing_writes(errno.ENOSPC)
    with caplog.at_level(logging.WARNING):
        seconds = cpu_dtype_timings(folder=tmp_path, cpu="x", measure=lambda dtype: 1.0)
    assert set(seconds) and "The dtype timings could not be saved" in caplog.text
    assert cpu_dtype_timings(folder=tmp_path, cpu="x", measure=lambda dtype: 2.0)["float32"] == 2.0  # again


def test_two_writers_at_once_leave_one_whole_measurement(tmp_path):
    """Each writes a temporary file of its own under the lock: the file read after is one writer's, whole."""
    path = table_path(KEY, tmp_path)
    start = threading.Barrier(8)

    def writer(i):
        start.wait()
        write_keyed(path, KEY, costs={"shape": {"dense": {"1": float(i)}}}, pad="x" * 200_000)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kept = read_keyed(path, KEY)
    assert kept is not None and len(kept["pad"]) == 200_000
    assert json.loads(path.read_text())["costs"]["shape"]["dense"]["1"] in range(8)
    assert not list(tmp_path.rglob("*.tmp"))


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test: an output checked before the run must stop it before the first model."""
    from specviz.commands import atlas, trace
    from specviz.models import loading

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded before the output was checked")
    monkeypatch.setattr(trace, "load_spec", load)
    monkeypatch.setattr(atlas, "load_spec", load)
    monkeypatch.setattr(loading, "load_pair", load)


@pytest.mark.parametrize("argv, flag", [
    (["trace", "--draft", "tiny", "--target", "tiny", "--prompt", "the a", "--out", "{bad}/trace.json"], "--out"),
    (["bench", "--draft", "tiny", "--target", "tiny", "--json", "{bad}/bench.json"], "--json"),
    (["bench", "--draft", "tiny", "--target", "tiny", "--html", "{bad}/bench.html"], "--html"),
    (["costs", "--draft", "tiny", "--target", "tiny", "--json", "{bad}/costs.json"], "--json"),
    (["atlas", "--draft", "tiny", "--target", "tiny", "--prompts", "p.txt", "--json", "{bad}/a.json"], "--json"),
    (["atlas", "--draft", "tiny", "--target", "tiny", "--prompts", "p.txt", "--export-rejections", "{bad}/r.jsonl"],
     "--export-rejections"),
])
def test_an_output_that_cannot_be_written_stops_a_command_before_it_runs(tmp_path, capsys, no_model, argv, flag):
    """Checked before any model loads or any measurement runs: a bench's minutes are not lost at its last line.
    (Its folder would be made as it writes; here it cannot be: a file stands in the way.)"""
    from specviz import cli

    (tmp_path / "a file").write_text("")
    bad = tmp_path / "a file" / "out"
    code = cli.main([a.format(bad=bad) for a in argv])
    err = capsys.readouterr().err
    assert code == cli.MACHINE_FAULT and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith(f"specviz {argv[0]}: cannot write {flag} {bad}/")
    assert f"cannot make the folder {bad}: " in err and err.strip().endswith("; nothing was run.")


def test_a_missing_output_folder_is_made_by_the_write_not_by_the_check(tmp_path):
    """The check makes nothing (a command refused for another flag leaves no folder behind); the write makes it."""
    from specviz.runs.outputs import unwritable, write_atomic

    out = tmp_path / "new" / "deeper" / "bench.json"
    assert unwritable(str(out)) is None and not (tmp_path / "new").exists()
    write_atomic(out, "{}")
    assert out.read_text() == "{}" and [p.name for p in out.parent.iterdir()] == ["bench.json"]


def test_an_output_on_a_read_only_disk_or_naming_a_folder_is_refused(tmp_path, monkeypatch, capsys, no_model):
    from specviz import cli
    from specviz.runs import outputs

    trace = ["trace", "--draft", "tiny", "--target", "tiny", "--prompt", "the a", "--out"]
    assert cli.main([*trace, str(tmp_path)]) == cli.MACHINE_FAULT
    assert "cannot write --out " + str(tmp_path) + ": it is a folder; nothing was run." in capsys.readouterr().err

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    monkeypatch.setattr(outputs.tempfile, "NamedTemporaryFile", read_only)
    assert cli.main([*trace, str(tmp_path / "t.json")]) == cli.MACHINE_FAULT
    assert f"Read-only file system in {tmp_path}; nothing was run." in capsys.readouterr().err


def test_a_switch_named_like_an_output_is_not_a_path(capsys):
    from specviz import cli

    assert cli.main(["whatif", "--acceptance", "0.7", "--k", "4", "--draft-cost", "0.1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("fault, code, said", [
    (KeyboardInterrupt(), 130, "interrupted; nothing more was written."),
    (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/cache/x"), 3, "No space left on device (/cache/x)."),
    (torch.OutOfMemoryError("CUDA out of memory"), 3, "out of memory: pick a smaller pair"),
    (OSError(errno.EROFS, os.strerror(errno.EROFS), "{cache}/converted"), 3,
     "Read-only file system ({cache}/converted): specviz keeps the converted pair and its timings in {cache}; free "
     "space there, or set SPECVIZ_CACHE to a writable folder"),
])
def test_every_command_maps_a_machine_fault_to_one_sentence(monkeypatch, capsys, tmp_path, fault, code, said):
    from specviz import cli
    from specviz.commands import whatif

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    said = said.format(cache=tmp_path)
    if isinstance(fault, OSError) and fault.filename:
        fault.filename = fault.filename.format(cache=tmp_path)

    def broken(args):
        raise fault

    monkeypatch.setattr(whatif, "cmd_whatif", broken)
    assert cli.main(["whatif", "--acceptance", "0.7", "--k", "4", "--draft-cost", "0.1"]) == code
    err = capsys.readouterr().err
    assert err.startswith("specviz whatif: ") and said in err and "Traceback" not in err


def test_sigterm_ends_a_command_as_ctrl_c_does(monkeypatch, capsys):
    """A real SIGTERM to this process, mid-command: one sentence, exit 130, and the handler restored after."""
    import signal

    from specviz import cli
    from specviz.commands import whatif

    before = signal.getsignal(signal.SIGTERM)

    def killed(args):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not end the command")

    monkeypatch.setattr(whatif, "cmd_whatif", killed)
    assert cli.main(["whatif", "--acceptance", "0.7", "--k", "4", "--draft-cost", "0.1"]) == 130
    assert "specviz whatif: interrupted" in capsys.readouterr().err and signal.getsignal(signal.SIGTERM) == before


# --- the converted pair: written whole, recorded file by file, trusted only while whole ---------------------------


def converted_folder(path, source="abc"):
    from specviz.models.converted import write_manifest

    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"weights" * 1000)
    (path / "config.json").write_text("{}")
    write_manifest(path, source)
    return path


def test_a_converted_folder_is_trusted_only_while_every_recorded_file_is_there_at_its_size(tmp_path):
    from specviz.models.converted import MANIFEST, complete

    folder = converted_folder(tmp_path / "c")
    assert complete(folder, "abc") and not complete(folder, "another source")
    (folder / "model.safetensors").write_bytes(b"weights" * 999)  # truncated, as by a kill mid-write
    assert not complete(folder, "abc")
    legacy = converted_folder(tmp_path / "legacy")
    (legacy / MANIFEST).unlink()  # converted before files were recorded: trusted on its stamp, as then
    assert complete(legacy, "abc")
    (legacy / MANIFEST).write_text("{not json")  # a damaged record is not trusted
    assert not complete(legacy, "abc")


def test_prepare_verify_finds_a_flipped_bit_that_a_size_cannot(tmp_path):
    from specviz.models.converted import MANIFEST, complete, verify

    folder = converted_folder(tmp_path / "c")
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[100] ^= 1
    (folder / "model.safetensors").write_bytes(bytes(data))
    assert complete(folder, "abc") and verify(folder, "abc") == ["model.safetensors"]
    (folder / MANIFEST).unlink()
    assert verify(folder, "abc") == [] and (folder / MANIFEST).exists()  # recorded now, as it is
    assert sorted(json.loads((folder / MANIFEST).read_text())) == ["config.json", "model.safetensors"]


def test_two_processes_preparing_at_once_convert_once_and_both_load_it(tmp_path, monkeypatch):
    """Two preparers started together (threads: the lock is a file lock, one per open file, as between
    processes): one converts into a folder of its own and renames it into place; the other waits, then finds it
    converted. Neither ever sees a half-written folder."""
    import time

    from specviz.models import preparing
    from specviz.models.embedded import EmbeddedModel, converted_dir, is_converted
    from specviz.models.tiny import tiny_model, tiny_tokenizer

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    model = EmbeddedModel("target", "a test model", (), "1", "m.gguf", 1, "f" * 64)
    conversions = []

    def convert(*args, **kwargs):
        conversions.append(1)
        time.sleep(0.5)  # long enough for the other to arrive while this one converts
        return tiny_model(0, 64), tiny_tokenizer()
    monkeypatch.setattr(preparing, "assemble", lambda m, progress=True: tmp_path / "m.gguf")
    monkeypatch.setattr(preparing, "from_pretrained", convert)
    results = []
    threads = [threading.Thread(target=lambda: results.append(preparing.prepare_embedded(model, lambda s: None)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(conversions) == 1 and results == [converted_dir(model)] * 2 and is_converted(model)
    assert sorted(p.name for p in converted_dir(model).parent.iterdir() if not p.name.endswith(".lock")) == ["target"]


def test_a_half_dtype_copy_holds_what_a_load_in_that_dtype_computes_and_is_written_whole(tmp_path, monkeypatch):
    """The bf16 copy a bf16 load reads is made straight from the GGUF (no float32 copy on disk unless a float32 run
    asks), and has the very weights a bf16 load of the float32 copy gets, as does the copy cast from a cached float32
    one (in shards, not the float32 file mapped whole: the load's peak); each recorded and made once."""
    from transformers import AutoModelForCausalLM

    from specviz.models import preparing
    from specviz.models.converted import cast_folder
    from specviz.models.embedded import EmbeddedModel, converted_dir, is_converted
    from specviz.models.tiny import tiny_model, tiny_tokenizer

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    model = EmbeddedModel("target", "a test model", (), "1", "m.gguf", 1, "f" * 64)
    monkeypatch.setattr(preparing, "assemble", lambda m, progress=True: tmp_path / "m.gguf")
    monkeypatch.setattr(preparing, "from_pretrained", lambda *a, **k: (tiny_model(0, 64), tiny_tokenizer()))
    lines = []
    folder = preparing.prepare_embedded(model, lines.append, dtype=torch.bfloat16)
    assert folder == converted_dir(model, torch.bfloat16) != converted_dir(model)
    assert is_converted(model, torch.bfloat16) and not is_converted(model)  # no float32 copy made for it
    assert preparing.prepare_embedded(model, lines.append, dtype=torch.bfloat16) == folder
    assert sum("bfloat16 copy" in line for line in lines) == 1  # made once
    assert preparing.prepare_embedded(model, lines.append) == converted_dir(model)  # float32 when first asked for
    assert is_converted(model) and sum("float32 copy" in line for line in lines) == 1
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    cast_folder(converted_dir(model), sharded, torch.bfloat16, shard_bytes=20_000)
    assert len(list(sharded.glob("*.safetensors"))) > 3
    cast = AutoModelForCausalLM.from_pretrained(converted_dir(model), dtype=torch.bfloat16).state_dict()
    for copy in (folder, sharded):
        got = AutoModelForCausalLM.from_pretrained(copy, dtype=torch.bfloat16, disable_mmap=True).state_dict()
        assert got.keys() == cast.keys() and all(torch.equal(got[k], cast[k]) for k in cast)


def test_a_half_copy_is_cast_from_a_cached_float32_copy_not_converted_again(tmp_path, monkeypatch):
    from specviz.models import preparing
    from specviz.models.embedded import EmbeddedModel, converted_dir, is_converted
    from specviz.models.tiny import tiny_model, tiny_tokenizer

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    model = EmbeddedModel("target", "a test model", (), "1", "m.gguf", 1, "f" * 64)
    conversions = []
    monkeypatch.setattr(preparing, "assemble", lambda m, progress=True: tmp_path / "m.gguf")
    monkeypatch.setattr(preparing, "from_pretrained",
                        lambda *a, **k: conversions.append(1) or (tiny_model(0, 64), tiny_tokenizer()))
    lines = []
    preparing.prepare_embedded(model, lines.append)
    assert preparing.prepare_embedded(model, lines.append, dtype=torch.bfloat16) == converted_dir(model, torch.bfloat16)
    assert conversions == [1] and is_converted(model, torch.bfloat16)
    assert any(line.startswith("Writing a bfloat16 copy") for line in lines)


# what a run measures once per machine (kernel tables, the dtype, compiled step probes) is not what these tests are
# about: in the empty cache each starts in, the dtype, kernels and step are named instead
NOTHING_MEASURED = ("--dtype", "float32", "--kernels", "plain", "--step", "eager")


def signalled_once_reported(argv: list[str], tmp_path, out, reported, sig, prompts: int = 2):
    """A real `specviz ARGV` subprocess, sent `sig` once its JSON report `out` holds `prompts` finished prompts
    (`reported(report)` counts them); returns the process and the counts it read on the way. A report is read only
    whole: a half-written file would fail to parse for good and the loop would never send the signal."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    # one thread, as the suite's own tiny-model tests run: beside a busy pytest worker, a second OpenMP thread spinning
    # made this process 7x slower (104 s against 15 s alone for the bench below)
    env = {**os.environ, "SPECVIZ_CACHE": str(tmp_path / "c"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "specviz"), *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    seen = []
    while proc.poll() is None:
        try:
            seen.append(reported(json.loads(out.read_text())))
        except (OSError, ValueError):
            pass  # not written yet
        if seen and seen[-1] >= prompts:
            proc.send_signal(sig)
            break
        time.sleep(0.02)
    return proc, seen


def test_a_bench_killed_after_two_prompts_leaves_the_report_of_those_two(tmp_path):
    """A real `specviz bench` (the tiny pair, 6 prompts) sent SIGTERM once its report holds 2 finished prompts: it
    exits as interrupted (130) in one sentence, and its JSON is whole and reports exactly the prompts it finished,
    with what it covers and how to finish. (Before, the report was written only at the end: nothing was kept.)"""
    import signal

    out = tmp_path / "bench.json"
    bench, seen = signalled_once_reported(
        ["bench", "--draft", "tiny", "--target", "tiny", "--limit", "6", "--k", "4", "--confidence", "0",
         "--max-new-tokens", "40", "--reps", "2", "--no-progress", "--json", str(out), *NOTHING_MEASURED], tmp_path, out,
        lambda report: report["meta"]["partial"]["reported_prompts"], signal.SIGTERM)
    _, err = bench.communicate(timeout=120)
    assert bench.returncode == 130 and "Traceback" not in err, err
    assert seen and seen[0] >= 1 and seen[-1] >= 2  # it was reporting as it went
    report = json.loads(out.read_text())
    partial = report["meta"]["partial"]
    assert partial["of"] == 6 and partial["reported_prompts"] == len(partial["done"]) >= 2
    assert report["summary"]["reported_on"] == partial["done"]
    assert {r["id"] for r in report["runs"]} == set(partial["done"])
    assert err.strip().splitlines()[-1].startswith(f"specviz bench: stopped after {partial['reported_prompts']} of 6")
    assert not list(tmp_path.glob(".bench.json.*.tmp"))  # no temporary file left beside it


def test_an_output_written_on_a_full_disk_keeps_the_file_it_replaces(tmp_path, monkeypatch):
    """Every report a command writes goes through `write_atomic`: a full disk mid-write (ENOSPC from the write) leaves
    the earlier report whole and no temporary file; a write that succeeds replaces it whole."""
    import io

    from specviz.runs.outputs import write_atomic

    out = tmp_path / "report.json"
    write_atomic(out, '{"prompts": 2}')

    class Full(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    real = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: (os.close(fd), Full())[1])
    with pytest.raises(OSError):
        write_atomic(out, '{"prompts": 3}')
    monkeypatch.setattr(os, "fdopen", real)
    assert out.read_text() == '{"prompts": 2}' and [p.name for p in tmp_path.iterdir()] == ["report.json"]
    write_atomic(out, '{"prompts": 3}')
    assert out.read_text() == '{"prompts": 3}'


def every_command() -> list[tuple[str, list[str]]]:
    """Each `specviz` subcommand (and engines' own), with the fewest arguments it parses with."""
    from specviz import cli

    needs = {"trace": ["--prompt", "hi"], "atlas": ["--prompts", "p.jsonl"],
             "whatif": ["--acceptance", "0.7", "--k", "4", "--draft-cost", "0.1"],
             "race": ["--spec", "http://127.0.0.1:1", "--plain", "http://127.0.0.1:2"]}
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    commands = []
    for name, parser in sub.choices.items():
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for inner in (list(nested[0].choices) if nested else [None]):
            argv = [name, *([inner] if inner else []), *needs.get(inner or name, [])]
            commands.append((" ".join(argv[:1 + bool(inner)]), argv))
    return commands


@pytest.mark.parametrize("fault", [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/x/out.json"),
                                   OSError(errno.EROFS, os.strerror(errno.EROFS), "/x/cache"),
                                   torch.OutOfMemoryError("out of memory"), KeyboardInterrupt(),
                                   MemoryError()], ids=["full disk", "read-only", "GPU memory", "interrupt", "memory"])
def test_no_command_prints_a_traceback_for_a_machine_fault(monkeypatch, capsys, fault):
    """Every subcommand, its work replaced by one that fails as the machine can (a full or read-only disk, memory, an
    interrupt): one line on stderr naming the command, an exit code that says which (3: the machine; 130:
    interrupted), never a traceback."""
    from specviz import cli

    commands = every_command()
    assert len(commands) >= 12  # prepare … loadtest, and engines race / llamacpp / vllm
    build = cli.build_parser

    def failing_parser():
        parser = build()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    sub.set_defaults(func=lambda args: (_ for _ in ()).throw(fault))
        return parser
    monkeypatch.setattr(cli, "build_parser", failing_parser)
    for name, argv in commands:
        code = cli.main(argv)
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, (name, err)
        assert code == (130 if isinstance(fault, KeyboardInterrupt) else 3), (name, code, err)


def test_an_atlas_killed_outright_keeps_the_report_of_the_prompts_it_finished(tmp_path):
    """A real `specviz atlas` (tiny pair, 30 prompts) killed with SIGKILL (no handler runs: the OOM killer, a power
    cut of the process) once its JSON holds 2 prompts: the file is whole and reports the prompts it finished, marked
    stopped. (Before, the JSON was written only at the end: nothing was kept.)"""
    import signal

    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "atlas.json"
    prompts.write_text("".join(json.dumps({"prompt": f"the man said that it was good and {i}"}) + "\n"
                               for i in range(30)))
    atlas, seen = signalled_once_reported(
        ["atlas", "--draft", "tiny", "--target", "tiny", "--prompts", str(prompts), "--max-new-tokens", "60",
         "--json", str(out), *NOTHING_MEASURED], tmp_path, out, lambda report: len(report["prompts"]), signal.SIGKILL)
    atlas.communicate(timeout=60)
    assert atlas.returncode == -signal.SIGKILL and seen and seen[0] >= 1  # killed mid-way; it reported as it went
    report = json.loads(out.read_text())
    assert report["finished"] == "stopped" and 2 <= len(report["prompts"]) < 30
    assert not list(tmp_path.glob(".atlas.json.*.tmp"))
