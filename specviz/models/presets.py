"""The pairs offered in the app's model menu: same-family pairs (draft and target share a tokenizer), and one
of two families (the draft's vocabulary mapped into the target's: `families.py`).

Hub pairs need the hub (or its local cache); the 7B/8B targets are meant for a GPU.
"""

from __future__ import annotations

from specviz.models.pair import EMBEDDED, SMOLLM2, TINY

PRESETS: dict[str, tuple[str | None, str]] = {
    "Embedded: Qwen2.5-Coder 0.5B → 1.5B Instruct (offline)": (EMBEDDED, EMBEDDED),
    "Another family: SmolLM2-135M → Qwen2.5-Coder 1.5B (offline; vocabularies mapped)": (SMOLLM2, EMBEDDED),
    "Qwen2.5 0.5B → 7B Instruct (hub, GPU)": ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct"),
    "Qwen2.5-Coder 0.5B → 7B Instruct (hub, GPU)": ("Qwen/Qwen2.5-Coder-0.5B-Instruct",
                                                     "Qwen/Qwen2.5-Coder-7B-Instruct"),
    "Llama 3.2 1B → Llama 3.1 8B Instruct (hub, GPU)": ("meta-llama/Llama-3.2-1B-Instruct",
                                                         "meta-llama/Llama-3.1-8B-Instruct"),
    "Target only: prompt lookup or self-speculation drafters (offline)": (None, EMBEDDED),
    "Tiny random pair (instant; to try the UI, not the models)": (TINY, TINY),
}
