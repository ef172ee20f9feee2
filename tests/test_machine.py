"""A report names its machine from what the process reads itself: a number is only that machine's."""

from __future__ import annotations

from specviz.kernels.build import cpu_fields
from specviz.bench.machine import described

ZEN5 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu avx2 avx512f avx512_bf16 avx512vl

processor\t: 1
model name\t: another
"""


def test_the_machine_is_described_by_family_model_and_the_instruction_sets_that_pick_kernels(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(ZEN5)
    fields = cpu_fields(str(info))
    assert fields["model name"] == "AMD EPYC"  # the first processor's, not the last's
    assert described(fields, 2, 24 * 2**30) == \
        "AMD EPYC (family 26 model 2; AVX-512, AVX512-BF16, no AMX), 2 cores, 24 GiB"
    amx = dict(fields, flags="avx512f amx_tile", **{"model name": "Intel Xeon"})
    assert "AVX-512, no AVX512-BF16, AMX" in described(amx, 2, 8 * 2**30)
    assert described({}, 4, 2**31).endswith(", 4 cores, 2 GiB")  # no /proc/cpuinfo: what platform says


def test_torch_or_onednn_kept_below_avx512_keeps_specviz_kernels_and_tables_below_it_too(tmp_path):
    from specviz.kernels.build import cpu_flags, isa_cap
    from specviz.models.kernel_table import cpu_fingerprint

    info = tmp_path / "cpuinfo"
    info.write_text(ZEN5.replace("avx512vl", "avx512vl amx_tile avx512_vnni"))
    everything = {"fpu", "avx2", "avx512f", "avx512_bf16", "avx512vl", "amx_tile", "avx512_vnni"}
    assert cpu_flags(str(info), environ={}) == everything
    assert cpu_flags(str(info), environ={"ATEN_CPU_CAPABILITY": "avx512"}) == everything  # not a cap
    for env in ({"ATEN_CPU_CAPABILITY": "avx2"}, {"ATEN_CPU_CAPABILITY": "DEFAULT"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"}):
        assert cpu_flags(str(info), environ=env) == {"fpu", "avx2"}, env
        assert isa_cap(env) is not None
    # its own kernel tables and dtype timings: torch's and oneDNN's kernels differ below AVX-512
    plain = cpu_fingerprint(str(info), environ={})
    capped = cpu_fingerprint(str(info), environ={"ONEDNN_MAX_CPU_ISA": "avx2"})
    assert plain == "AMD EPYC | fpu avx2 avx512f avx512_bf16 avx512vl amx_tile avx512_vnni"  # as before: tables kept
    assert capped == plain + " | ONEDNN_MAX_CPU_ISA=avx2"


def test_under_the_cap_specviz_kernels_serve_at_avx2_and_the_report_says_so(monkeypatch, caplog):
    import torch

    from specviz.bench.machine import machine
    from specviz.kernels import amx, build, rows, streamed, w4a8

    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    weight = torch.empty(64, 64, dtype=torch.bfloat16)
    if build.AVX2 <= build.cpu_flags():  # the few-row kernel, the attention and the draft's at AVX2; the tiles not at all
        assert (streamed.level_for(torch.bfloat16), rows.level_for(torch.bfloat16)) == ("avx2", "avx2")
        assert streamed.applies(weight) and rows.available(torch.bfloat16) and not amx.applies(weight)
        assert w4a8.applies(64, 64, w4a8.GROUP, torch.bfloat16)
    assert machine()["described"].endswith(", run below AVX-512 (ATEN_CPU_CAPABILITY=avx2)")
    if "avx512f" in build.cpu_flags(environ={}):  # the sentence names the setting, not a CPU that lacks it
        with caplog.at_level("WARNING"):
            flags = streamed.FLAGS + streamed.LEVELS["avx512"]
            assert build.library(streamed.SOURCE, flags, {"avx512f"}, "A kernel") is None
        assert "A kernel is not used: this process is kept below AVX-512 (ATEN_CPU_CAPABILITY=avx2)." in caplog.text
