"""A machine as a person recognises it ("Intel Xeon (Emerald Rapids, 2 cores, AVX512-BF16, no AMX)"), from the
line a report's own metadata describes it with (`meta.machine.described`, which keeps the CPUID family and model)."""

from __future__ import annotations

import re

# CPUID (vendor word, family, model range) -> the generation's name, for the CPUs this project's reports ran on
GENERATIONS = (
    ("Intel", 6, range(85, 86), "Skylake/Cascade Lake"), ("Intel", 6, range(106, 109), "Ice Lake"),
    ("Intel", 6, range(143, 144), "Sapphire Rapids"), ("Intel", 6, range(207, 208), "Emerald Rapids"),
    ("Intel", 6, range(173, 175), "Granite Rapids"),
    ("AMD", 25, range(0, 16), "Zen 3"), ("AMD", 25, range(16, 32), "Zen 4"), ("AMD", 25, range(160, 176), "Zen 4"),
    ("AMD", 26, range(0, 256), "Zen 5"),
)


def generation(name: str, described: str) -> str | None:
    m = re.search(r"family (\d+) model (\d+)", described)
    if not m:
        return None
    family, model = int(m.group(1)), int(m.group(2))
    return next((g for vendor, f, models, g in GENERATIONS if vendor in name and f == family and model in models),
                None)


def units(described: str) -> str:
    """The instruction sets that decide specviz's kernels, in a person's words."""
    if "run below AVX-512" in described or "no AVX-512" in described:
        return "without AVX-512" + (" (held below it)" if "run below AVX-512" in described else "")
    if re.search(r"(?<!no )AMX", described):
        return "AMX"
    if "AVX512-BF16" in described:
        return "AVX512-BF16, no AMX" if "no AMX" in described else "AVX512-BF16"
    if "AVX-512" in described:
        return "AVX-512, no bf16 units"
    return ""


def name(machine: dict) -> str:
    """"Intel Xeon (Emerald Rapids, 2 cores, AVX512-BF16, no AMX)" for a report's `meta.machine`."""
    described = machine.get("described") or machine.get("cpu") or ""
    cpu = re.sub(r"^an? ", "", described.split(" (")[0].split(",")[0])
    cpu = re.sub(r"\((R|TM)\)| Processor| CPU| with .*", "", cpu).strip()
    gen = generation(cpu, described)
    if gen is None and (m := re.match(r"^(AMD EPYC) (Zen \d)$", cpu)):  # an older report's words: "AMD EPYC Zen 4"
        cpu, gen = m.group(1), m.group(2)
    if gen:  # said once: "AMD EPYC Zen 5" or "AMD EPYC (Zen 5)" named it already
        cpu = re.sub(rf" \(?{re.escape(gen)}\)?$", "", cpu)
    cores = machine.get("cpu_count") or (m.group(1) if (m := re.search(r"(\d+) cores", described)) else "?")
    gpu = machine.get("gpu")
    detail = ", ".join(x for x in (gen, f"{cores} cores", units(described)) if x)
    return f"{cpu} ({detail})" + (f" with an {gpu}" if gpu else "")
