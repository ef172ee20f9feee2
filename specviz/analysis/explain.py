"""Why a run was faster or slower than the target alone, in one sentence computed from the run.

Per round, speculative decoding pays K draft steps and one verify forward and gets the accepted
drafts plus one token. In units of the target's own step T1 (ĉ = draft step / T1, v = verify / T1),
with acceptance α per drafted token (i.i.d. approximation):

    tokens per round E = (1 - α^(K+1)) / (1 - α),   cost per round = K·ĉ + v,   speedup = E / (K·ĉ + v)

The predicted speedup itself comes from `predict.py` over the run's own rounds (the bench's formula);
the closed form above only answers "at what acceptance would this draft cost and K break even?".
"""

from __future__ import annotations

from dataclasses import dataclass

from specviz.analysis.stats import RunStats, ratio


def tokens_per_round(alpha: float, k: float) -> float:
    """E(K) for i.i.d. acceptance α: 1 + α + α² + … + α^K."""
    return k + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def break_even_acceptance(c: float, verify: float, k: float) -> float | None:
    """The acceptance at which E(K) = K·ĉ + v (speedup 1); 0 if even rejecting everything pays (a round
    then costs less than a target step), None if even accepting everything does not."""
    cost = k * c + verify
    if cost <= 1.0:
        return 0.0
    if cost >= k + 1.0:
        return None
    lo, hi = 0.0, 1.0  # E grows with α: bisect
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tokens_per_round(mid, k) < cost else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Explanation:
    measured: float  # speculative tokens/s over the target alone's (the race's clocks)
    predicted: float | None  # the bench's formula on this run's rounds and measured costs (None for trees)
    acceptance: float  # accepted / drafted
    tokens_per_round: float  # emitted per target forward
    k: float  # drafted per round, on average
    c: float  # draft step / target step
    verify: float  # verify forward / target step
    break_even: float | None  # acceptance needed for speedup 1 at this ĉ, v and K
    tree_nodes: float | None = None  # tree rounds: nodes per round (then `predicted` is None: no chain model)
    draft: float = 0.0  # drafting per round / target step

    @property
    def round_cost(self) -> float:
        """A round's cost in target steps: K·ĉ + v."""
        return self.k * self.c + self.verify


def explain(stats: RunStats) -> Explanation | None:
    """The numbers behind a race's verdict; None until both lanes ran and a round drafted something."""
    s, cost = stats.spec, stats.cost
    if stats.speedup is None or cost is None or not s.drafted:
        return None
    k = s.drafted / s.rounds
    verify = ratio(s.verify_s / s.rounds, cost.target_step_s)
    if stats.tree_nodes is not None:
        return Explanation(measured=stats.speedup, predicted=None, acceptance=s.acceptance_rate,
                           tokens_per_round=s.mean_accepted_tokens, k=k, c=cost.c, verify=verify, break_even=None,
                           tree_nodes=stats.tree_nodes, draft=ratio(s.draft_s / s.rounds, cost.target_step_s))
    if stats.predicted_speedup is None:
        return None
    return Explanation(measured=stats.speedup, predicted=stats.predicted_speedup, acceptance=s.acceptance_rate,
                       tokens_per_round=s.mean_accepted_tokens, k=k, c=cost.c, verify=verify,
                       break_even=break_even_acceptance(cost.c, verify, k))


EVEN = 0.05  # within 5% of the target alone: "about even" (a race's clocks are not finer than that on a CPU)


def sentence(e: Explanation) -> str:
    """One sentence: what the run measured, and when it lost, which of the numbers made it so."""
    if e.tree_nodes is not None:
        return _tree_sentence(e)
    facts = (f"acceptance {e.acceptance:.0%} gave {e.tokens_per_round:.1f} tokens per target forward, "
             f"and a round cost {e.k:.1f} draft steps × {e.c:.2f} + a verify of {e.verify:.2f} = "
             f"{e.round_cost:.2f} target steps, so the model predicts {e.predicted:.2f}×")
    if abs(e.measured - 1.0) < EVEN:
        where = "no acceptance" if e.break_even is None else f"{e.break_even:.0%} acceptance"
        return f"About even: {facts}; at this draft cost and K the break-even point is {where}."
    if e.measured > 1.0:
        return f"Faster because {facts}."
    if e.break_even is None:
        return (f"Slower because the draft is too expensive for this K: {facts}; even accepting every draft "
                f"({e.k + 1:.1f} tokens per round) would not pay for {e.round_cost:.2f} target steps: lower K "
                "or use a cheaper draft.")
    if e.acceptance < e.break_even:
        return (f"Slower because acceptance is too low: {facts}; at this draft cost and K it breaks even "
                f"at {e.break_even:.0%} acceptance.")
    return (f"Slower than the model's prediction: {facts} (break-even {e.break_even:.0%} acceptance); the "
            "gap is time outside the rounds: the prompt's forward (which speculation does not speed up), "
            "building events, or a noisy machine.")


def _tree_sentence(e: Explanation) -> str:
    facts = (f"a draft tree of {e.tree_nodes:.1f} nodes per round gave {e.tokens_per_round:.1f} tokens per target "
             f"forward, and a round cost {e.draft:.2f} target steps of drafting + a verify of {e.verify:.2f}")
    if abs(e.measured - 1.0) < EVEN:
        return f"About even: {facts}."
    if e.measured > 1.0:
        return f"Faster because {facts}."
    return (f"Slower because {facts}: each node is a token the target's verify reads, and on this machine that "
            "is not free (the bench's verify-cost curve); a smaller tree budget, or the chain, may pay better.")


# Bytes per weight each precision reads in a one-token step (int4: 4 bits + a bf16 scale and zero per 32 weights).
BYTES_PER_WEIGHT = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.0 + 2 / 1536, "int4": 0.5 + 4 / 32}
GPU_LIKE, CPU_ENGINE_LIKE = 0.25, 0.5  # c below: a nearly free draft; above: a draft step costs most of a target's


def precisions(target_name: str, draft_name: str, dtype: str) -> tuple[str, str]:
    """The precision each model's one-token step runs in, from the names the pair was given at load."""
    target = next((q for q in ("int4", "int8") if f"[{q} weights]" in target_name), dtype)
    draft = next((q for q in ("int4", "int8") if f"[{q} draft step]" in draft_name), dtype)
    return target, draft


def max_paying_c(e: Explanation) -> float | None:
    """The largest draft cost (in target steps) at which this run's acceptance and K still beat the target alone:
    E > K·c + v  <=>  c < (E - v) / K. None if no draft cost would (the verify alone costs more than E)."""
    if e.k <= 0 or e.tokens_per_round <= e.verify:
        return None
    return (e.tokens_per_round - e.verify) / e.k


def regime(c: float) -> str:
    """The economics a draft cost c stands for, in a few words."""
    return "a GPU's economics" if c < GPU_LIKE else "a CPU engine's economics" if c >= CPU_ENGINE_LIKE else (
        "between a GPU's and a CPU engine's economics")


def economics_headline(e: Explanation, target: str, draft: str) -> str:
    """One line the verdict can show whole; `economics` is the sentence behind it."""
    limit = max_paying_c(e)
    pays = "no draft cost pays here" if limit is None else f"pays while c < {limit:.2f}"
    return f"c = {e.c:.2f} ({target} target, {draft} draft): {regime(e.c)}; {pays}"


def economics(e: Explanation, target: str, draft: str) -> str:
    """What c is, where it comes from, which regime that is, and where this pair would stop paying."""
    regime = ("the economics of a GPU serving a large target: a draft step is nearly free beside a target step"
              if e.c < GPU_LIKE else
              "the economics of a CPU engine such as llama.cpp with a quantized target: a draft step costs most of "
              "a target step" if e.c >= CPU_ENGINE_LIKE else "between a GPU's economics and a CPU engine's")
    text = (f"The draft costs {e.c:.2f} of a target step because the target runs in {target} and the draft in "
            f"{draft}: {regime}.")
    limit = max_paying_c(e)
    text += (" At this acceptance no draft cost would pay." if limit is None else
             f" At this acceptance and K speculation pays while the draft costs under {limit:.2f} of a target step")
    if limit is not None and target != "int4" and target in BYTES_PER_WEIGHT:
        cheaper = BYTES_PER_WEIGHT[target] / BYTES_PER_WEIGHT["int4"]
        # only c is scaled here: an int4 verify may cost more target steps than this one (race it to see)
        outcome = ("beyond it: this pair would lose" if e.c * cheaper >= limit else
                   "within it only if an int4 verify stays as cheap as this one (race it: target precision int4)")
        text += (f"; with an int4 target, as llama.cpp runs it, the target reads {cheaper:.1f}× fewer bytes a step, "
                 f"so c would be about {e.c * cheaper:.2f}, {outcome}.")
    elif limit is not None:
        text += "."
    return text
