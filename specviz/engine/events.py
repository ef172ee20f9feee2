"""Typed events: everything a consumer (UI, bench, trace) may know about a run.

Plain dataclasses of ints, floats and strings, so `dataclasses.asdict` gives JSON directly.
Consumers read these and nothing else; they never touch the engine's tensors or caches.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

ACCEPTED, REJECTED, NOT_VERIFIED = "accepted", "rejected", "not_verified"
CORRECTION, BONUS, TARGET = "correction", "bonus", "target"
# why a run ended: its end-of-sequence token, max_new_tokens, a stop request, or the server's time budget
Finish = Literal["eos", "length", "stopped", "budget"] | None


@dataclass
class Candidate:
    """One entry of a top-n list: a token and its probability."""

    id: int
    text: str
    prob: float


@dataclass
class DraftedToken:
    id: int
    text: str
    q: float  # q(x): probability under the distribution the draft sampled from
    p: float  # p(x): the target's probability under the same warps
    accept_prob: float  # min(1, p/q)
    u: float  # the uniform draw; accepted iff u < accept_prob
    status: str  # accepted | rejected | not_verified (after a rejection or an end)
    q_soft: float  # softmax(draft logits)(x) at temperature 1: informative even when greedy
    p_soft: float  # softmax(target logits)(x) at temperature 1
    target_top2_gap: float  # target's top-1 minus top-2 logit here: near 0 means a near-tie
    q_top: list[Candidate] = field(default_factory=list)
    p_top: list[Candidate] = field(default_factory=list)
    residual_top: list[Candidate] = field(default_factory=list)  # norm(max(0, p - q)): where a correction comes from
    predicted: float | None = None  # the acceptance model's prediction for this token (None in older traces)
    # entropy (nats) of softmax(draft logits) at temperature 1, where the draft proposed x: how unsure it showed
    # itself, informative even when greedy (None in older traces and in tree rounds)
    q_entropy: float | None = None
    # β = Σ min(p, q) over the vocabulary at this position, from the warped p and q the rule used: the chance it is
    # accepted before u is drawn (greedy: 1 where the argmaxes agree, else 0; None in older traces and trees)
    beta: float | None = None


@dataclass
class EmittedToken:
    """A token the target chose itself: a correction, a bonus, or an AR step."""

    id: int
    text: str
    kind: str  # correction | bonus | target
    p: float  # probability of this token under the distribution it was sampled from
    p_soft: float
    target_top2_gap: float
    p_top: list[Candidate] = field(default_factory=list)
    draftable: bool = True  # False: the draft (of another family) has no such token; only the target could say it


@dataclass
class TreeNode:
    """One node of a tree round's draft tree (the 'tree' drafter): a candidate token after its parent's path."""

    id: int
    text: str
    parent: int  # index of the parent node in the round's tree, -1: a child of the root (the last committed token)
    depth: int  # 1 for the root's children
    rank: int  # 0 for the draft's first choice among its siblings, 1 for the next...
    q: float  # the draft's probability of it after its parent's path (warped when sampling, softmax when greedy)
    p: float  # the target's probability of it there (same)
    status: str  # accepted (on the accepted path) | rejected (tried, rejected) | not_verified (never tried)
    accept_prob: float | None = None  # tried: its chance, p(x) / (p's mass left after the siblings tried before it)
    u: float | None = None  # tried: the uniform draw; accepted iff u < accept_prob


@dataclass
class Round:
    """One draft -> verify -> accept/correct round of speculative decoding."""

    index: int
    drafter: str
    k: int  # tokens drafted this round (may be < the configured K near the end or when adaptive)
    drafted: list[DraftedToken]
    n_accepted: int
    emitted: EmittedToken | None  # None when an end-of-sequence among the accepted tokens ended the run
    new_token_ids: list[int]  # what this round committed to the output, in order
    position: int  # index in the generated sequence of this round's first new token
    text: str  # the whole generated text so far
    draft_time: float  # seconds, as the device ran them (`plumbing.Phases`)
    verify_time: float  # one target forward + the rule, seconds, as the device ran them
    overhead_time: float  # building this event on the host, seconds
    finished: Finish = None
    prefill_time: float = 0.0  # the first round only: reading the prompt into both caches, seconds
    # the 'tree' drafter: every node of the round's draft tree (`drafted` is then the path the target followed:
    # the accepted nodes and, before a correction, the first sibling it rejected last)
    tree: list[TreeNode] = field(default_factory=list)

    @property
    def tokens_emitted(self) -> int:
        return len(self.new_token_ids)

    @property
    def expected_accepted(self) -> float | None:
        """The drafted tokens a round like this accepts on average: Σ_i Π_{j<=i} β_j (None without β)."""
        betas = [t.beta for t in self.drafted]
        if not betas or None in betas:
            return None
        total, reach = 0.0, 1.0
        for b in betas:
            reach *= b
            total += reach
        return total

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Step:
    """One token of plain autoregressive decoding of the target."""

    index: int
    token: EmittedToken
    text: str
    time: float  # seconds for this step, device-synchronized
    finished: Finish = None
    prefill_time: float = 0.0  # the first step only: reading the prompt into the cache, seconds

    def to_dict(self) -> dict:
        return asdict(self)


def until_eos(tokens: list[int], eos_ids) -> list[int]:
    """The tokens up to and including the first end-of-sequence: nothing is emitted after one."""
    return tokens[:next((j + 1 for j, t in enumerate(tokens) if t in eos_ids), len(tokens))]


def end_of_run(new: list[int], generated: int, eos_ids, max_new_tokens: int, should_stop) -> Finish:
    """Why a run ends after committing `new` (cut by `until_eos`), `generated` tokens in all; None if it goes on.
    `should_stop()` gives the caller's reason to end now ("stopped", "budget") or None."""
    if new[-1] in eos_ids:
        return "eos"
    if generated >= max_new_tokens:
        return "length"
    return should_stop() or None


def round_from_dict(d: dict) -> Round:
    drafted = [
        DraftedToken(**{**t, **{k: [Candidate(**c) for c in t[k]] for k in ("q_top", "p_top", "residual_top")}})
        for t in d["drafted"]
    ]
    e = d["emitted"]
    emitted = None if e is None else EmittedToken(**{**e, "p_top": [Candidate(**c) for c in e["p_top"]]})
    tree = [TreeNode(**n) for n in d.get("tree", [])]
    return Round(**{**d, "drafted": drafted, "emitted": emitted, "tree": tree})


def step_from_dict(d: dict) -> Step:
    t = d["token"]
    return Step(**{**d, "token": EmittedToken(**{**t, "p_top": [Candidate(**c) for c in t["p_top"]]})})
