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
