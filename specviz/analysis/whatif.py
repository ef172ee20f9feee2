"""What if: acceptance a, K and the draft's cost -> tokens per round, speedup, tokens/s, $ per million tokens.

The articles' shortcut ("4 x 0.73 ~ 2.9 tokens per target step, so 30 -> 87 tokens/s") beside the
model specviz predicts with (`predict.py`), here with the same acceptance a at every position:

    E(K) = 1 + a + a² + … + a^K = (1 - a^(K+1)) / (1 - a)        (K + 1 when a = 1)
    speedup(K) = E(K) / (K·c + R)

c = draft step / target step, R = one target forward over K+1 tokens / target step (1.0, "verification
is free", is the articles' assumption; a GPU comes close, a CPU does not). Time is counted in target
steps, so this is `predict.CostModel` with T1 = 1. One stream at batch 1, as in the articles: capacity
is one stream's tokens per hour of the hardware it runs on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import Field
from pydantic.dataclasses import dataclass as spec

from specviz.analysis.predict import CostModel, best_k, expected_tokens, predicted_speedup

CURVE_K = 16  # the speedup curve spans K = 1..16 (or up to the K asked about)
MAX_K = 256
HOUR_S = 3600.0


@spec(frozen=True)
class WhatIfInputs:
    """The calculator's inputs as a settings spec: the API's /whatif, the app's tab and `specviz whatif` check a value
    against it (`settings.spec.validate`: one sentence naming it); built directly, pydantic refuses what is out of
    range. The defaults are the articles' example (4 × 0.73; they give no draft cost: 0.1 is ours)."""

    acceptance: float = Field(0.73, ge=0, le=1, title="acceptance",
                              description="a: the chance each drafted token is accepted")
    k: int = Field(4, ge=1, le=MAX_K, title="K", description="tokens drafted per round")
    draft_cost: float = Field(0.1, ge=0, title="draft cost", description="c: draft step / target step")
    verify_ratio: float = Field(1.0, gt=0, title="verify ratio",
                                description="R: target forward over K+1 tokens / one-token step (1.0: as cheap as "
                                            "one step, as the articles assume)")
    target_tokens_per_s: float | None = Field(None, gt=0, title="target tokens/s",
                                              description="the target alone's speed (none: no rates)")
    gpu_hour_price: float | None = Field(None, ge=0, title="price per GPU-hour",
                                         description="$ per hour of the hardware one stream runs on (none: no cost)")


@dataclass(frozen=True)
class Rate:
    """One way of decoding one stream: its speed, its capacity and (with a price) its cost."""

    tokens_per_s: float
    tokens_per_hour: float  # capacity per GPU-hour
    usd_per_million: float | None  # needs a price per GPU-hour


@dataclass(frozen=True)
class WhatIf:
    acceptance: float  # a: per drafted token, the same at every position
    k: int
    draft_cost: float  # c
    verify_ratio: float  # R
    shortcut_tokens: float  # K × a: the articles' tokens per target step
    expected_tokens: float  # E(K): per target forward, accepted drafts + the correction or bonus
    speedup: float  # E / (K·c + R)
    curve: tuple[float, ...]  # curve[i]: the speedup at K = i + 1
    best_k: int
    target: Rate | None = None  # the target alone; rates need its speed
    shortcut: Rate | None = None  # what K × a promises
    speculative: Rate | None = None  # what E / (K·c + R) predicts

    @property
    def accepted_drafts(self) -> float:
        """a + a² + … + a^K: a round stops at its first rejection, so later drafts count for nothing."""
        return self.expected_tokens - 1.0


def rate(tokens_per_s: float, price_per_hour: float | None) -> Rate:
    per_hour = tokens_per_s * HOUR_S
    cost = price_per_hour / per_hour * 1e6 if price_per_hour is not None and per_hour > 0 else None
    return Rate(tokens_per_s, per_hour, cost)


def what_if(acceptance: float, k: int, draft_cost: float, verify_ratio: float = 1.0,
            target_tokens_per_s: float | None = None, gpu_hour_price: float | None = None) -> WhatIf:
    WhatIfInputs(acceptance=acceptance, k=k, draft_cost=draft_cost, verify_ratio=verify_ratio,  # in range
                 target_tokens_per_s=target_tokens_per_s, gpu_hour_price=gpu_hour_price)
    ks = range(1, max(CURVE_K, k) + 1)
    # time in target steps: the verify pass costs R whatever K (one number given, not a measured curve)
    cost = CostModel(1.0, draft_cost, (verify_ratio,) * (ks[-1] + 1))
    alpha = [acceptance]  # extended to every position: E(K) is then the geometric sum
    curve = tuple(predicted_speedup(alpha, cost, n) for n in ks)
    w = WhatIf(acceptance, k, draft_cost, verify_ratio, shortcut_tokens=k * acceptance,
               expected_tokens=expected_tokens(alpha, k), speedup=curve[k - 1], curve=curve,
               best_k=best_k(alpha, cost, ks))
    if target_tokens_per_s is None:
        return w
    t, p = target_tokens_per_s, gpu_hour_price
    return replace(w, target=rate(t, p), shortcut=rate(t * w.shortcut_tokens, p), speculative=rate(t * w.speedup, p))


def teaching_lines(w: WhatIf) -> list[str]:
    """The arithmetic, step by step, with the numbers given: the shortcut, E(K), the speedup, the best K."""
    a, k, c, r = w.acceptance, w.k, w.draft_cost, w.verify_ratio
    fast = w.target is not None
    line = f"Shortcut (the articles): K × a = {k} × {a:.2f} = {w.shortcut_tokens:.2f} tokens per target step"
    lines = [line + (f" → {w.target.tokens_per_s:.1f} × {w.shortcut_tokens:.2f} = "
                     f"{w.shortcut.tokens_per_s:.1f} tokens/s" if fast else "")]
    formula = (f"K + 1 = {k + 1} (every draft accepted)" if a == 1 else
               f"(1 − a^(K+1)) / (1 − a) = (1 − {a:.2f}^{k + 1}) / {1 - a:.2f} = {w.expected_tokens:.2f}")
    lines.append(f"Expected tokens per round: E = {formula}: {w.accepted_drafts:.2f} accepted drafts + "
                 "1 correction or bonus")
    lines.append(f"Speedup once the draft is paid for: E / (K·c + R) = {w.expected_tokens:.2f} / ({k} × {c:.2f} + "
                 f"{r:.2f}) = {w.speedup:.2f}×" + (f" → {w.speculative.tokens_per_s:.1f} tokens/s" if fast else ""))
    lines.append(f"Best K at a = {a:.2f}, c = {c:.2f}, R = {r:.2f}: K = {w.best_k} "
                 f"({w.curve[w.best_k - 1]:.2f}×)")
    lines.append(economics_line(w))
    lines.append(shortcut_note(w))
    return lines


def economics_line(w: WhatIf) -> str:
    """Which economics c stands for, and the largest c at which this a and K still pay: E > K·c + R."""
    from specviz.analysis.explain import CPU_ENGINE_LIKE, GPU_LIKE

    c = w.draft_cost
    regime = ("a GPU's economics: a draft step nearly free beside a large target's" if c < GPU_LIKE else
              "a CPU engine's economics (llama.cpp with a quantized target): a draft step costs most of a target "
              "step" if c >= CPU_ENGINE_LIKE else "between a GPU's economics and a CPU engine's")
    limit = (w.expected_tokens - w.verify_ratio) / w.k
    pays = (f"at a = {w.acceptance:.2f} and K = {w.k} speculation pays while c < (E − R) / K = {limit:.2f}"
            if limit > 0 else f"at a = {w.acceptance:.2f} and K = {w.k} no draft cost pays (E ≤ R)")
    return f"Draft cost c = {c:.2f} is {regime}; {pays}."


def shortcut_note(w: WhatIf) -> str:
    """Where K × a is right and where it misleads, in one sentence with this case's numbers."""
    return (f"K × a is right that one target step yields several tokens, but it counts drafts after the first "
            f"rejection (thrown away: on average only a + … + a^K = {w.accepted_drafts:.2f} are accepted) and "
            f"leaves out the correction or bonus token, so it can err either way (E = {w.expected_tokens:.2f} "
            f"here), and it takes drafting as free, while a round costs K·c + R = "
            f"{w.k * w.draft_cost + w.verify_ratio:.2f} target steps, which makes the speedup {w.speedup:.2f}×, not "
            f"{w.shortcut_tokens:.2f}×.")


def table(w: WhatIf) -> list[tuple[str, ...]]:
    """With and without speculation, side by side: a header, then one row per measure."""
    cols = ("target alone", "shortcut K × a", "speculative")
    rows = [("", *cols), ("tokens per target forward", "1.00", f"{w.shortcut_tokens:.2f}", f"{w.expected_tokens:.2f}"),
            ("speedup", "1.00×", f"{w.shortcut_tokens:.2f}×", f"{w.speedup:.2f}×")]
    rates = (w.target, w.shortcut, w.speculative)
    if w.target is None:
        return rows
    rows += [("tokens/s", *(f"{x.tokens_per_s:.1f}" for x in rates)),
             ("tokens per GPU-hour", *(f"{x.tokens_per_hour:,.0f}" for x in rates))]
    if w.target.usd_per_million is not None:
        rows.append(("$ per million tokens", *(f"{x.usd_per_million:.2f}" for x in rates)))
    return rows
