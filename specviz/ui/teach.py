"""Teaching text: the formulas panel and the captions of step mode (pure functions of events)."""

from __future__ import annotations

from html import escape

from specviz.engine.events import ACCEPTED, NOT_VERIFIED, REJECTED, Round
from specviz.analysis.stats import RunStats
from specviz.serving.recorded import clock_time

FORMULAS = r"""
### One round of speculative decoding

1. **Draft.** The small model proposes $K$ tokens $x_1, \dots, x_K$, each sampled from its
   distribution $q_i = q(\cdot \mid \text{prefix}, x_{<i})$.
2. **Verify.** The target scores the prefix plus all $K$ drafts in **one** forward pass, giving
   $p_1, \dots, p_{K+1}$ (the last one is the distribution after all $K$ drafts).
3. **Accept / correct.** Going left to right, draw $u_i \sim \mathcal{U}(0,1)$ and

$$\text{accept } x_i \iff u_i < \min\!\left(1, \frac{p_i(x_i)}{q_i(x_i)}\right).$$

   At the first rejection, stop and emit a **correction** drawn from the residual

$$r(x) = \frac{\max(0,\, p_i(x) - q_i(x))}{\sum_y \max(0,\, p_i(y) - q_i(y))}.$$

   If all $K$ are accepted, emit a **bonus** token from $p_{K+1}$. Every round emits at least one token.

**Why the output is exactly the target's distribution.** For any token $x$ at position $i$:

$$q(x)\,\min\!\left(1, \tfrac{p(x)}{q(x)}\right) + P(\text{reject})\, r(x) = \min(p, q)(x) + \max(0, p - q)(x) = p(x).$$

So speculative decoding changes the *speed*, never the distribution (see the "Same distribution"
tab). Greedy decoding is the special case of point masses: accept iff the draft's token is the
target's argmax, and the correction is the target's argmax.

### How fast?

With a per-token acceptance probability $\alpha$ (assumed independent across positions), the
expected number of tokens per round — per target forward — is

$$E = \frac{1 - \alpha^{K+1}}{1 - \alpha}.$$

A round costs $K$ draft steps of relative cost $c = \frac{\text{draft step}}{\text{target step}}$
plus one verify pass (about one target step when verifying $K+1$ tokens costs as much as one,
as it does on GPUs), so the speedup over the target alone is about

$$S \approx \frac{E}{K c + 1}.$$

The stats panel measures $\hat\alpha$ (accepted ÷ tested drafts), $K$ and $\hat c$ from the run's
own draft and verify times and compares the prediction with the measured race. It uses the
per-position form $E = 1 + \sum_{i=1}^{K} \prod_{j \le i} \hat\alpha_j$ (acceptance often drops
along a round), which is the formula above when every $\hat\alpha_j = \alpha$.
"""

RACE_NOTE = (
    "Both lanes really run on this machine with the same prompt, settings and seed. Running both at "
    "once on one device would slow both down, so the race **alternates**: it always advances the lane "
    "whose own clock is behind. Each lane's clock counts **only its own compute** (the wall time spent "
    "inside that lane's next step, device-synchronized), never the other lane's turns."
)


DISTRIBUTION_NOTE = (
    "Sample many short continuations of the prompt with speculative decoding and with the target alone (seed i "
    "for sample i), and compare the **first token** with the target's exact distribution. Each speculative first "
    "token went through accept/reject: it is an accepted draft or a correction from the residual. K, drafter, "
    "top-k and top-p come from the settings."
)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def tok(text: str) -> str:
    return f"<code>{escape(repr(text))}</code>"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _draft_line(r: Round) -> str:
    if r.k == 0:  # the model drafters stop only when one token is left; lookup when nothing matches
        last = "one token left, which the target makes by itself"
        why = {"model": last, "self": last, "lookup": "no match in the context"}.get(
            r.drafter, "no match in the context, or one token left")
        return f"- **Draft:** nothing proposed this round ({why})."
    per = f", {ms(r.draft_time / r.k)} per token" if r.k > 1 else ""
    drafted = " ".join(tok(t.text) for t in r.drafted)
    return f"- **Draft:** drafted {_plural(r.k, 'token')} in {ms(r.draft_time)}{per}: {drafted}"


def _verdict_lines(r: Round, greedy: bool) -> list[str]:
    accepted = [t for t in r.drafted if t.status == ACCEPTED]
    rejected = [t for t in r.drafted if t.status == REJECTED]
    skipped = sum(t.status == NOT_VERIFIED for t in r.drafted)
    lines = []
    if r.k:
        if greedy:
            rule = " (each is the target's argmax)"
        else:
            shown = ", ".join(f"{tok(t.text)} {t.u:.2f} < {t.accept_prob:.2f}" for t in accepted[:4])
            rule = f" (u < min(1, p/q): {shown}{'…' if len(accepted) > 4 else ''})"
        lines.append(f"- **Accept:** accepted {len(accepted)} of {r.k}{rule if accepted else ''}")
    if rejected:
        t = rejected[0]
        why = (f"not the target's argmax (p = {t.p_soft:.2f} vs q = {t.q_soft:.2f} at T=1)" if greedy
               else f"u = {t.u:.2f} ≥ min(1, p/q) = {t.accept_prob:.2f} (p = {t.p:.3f}, q = {t.q:.3f})")
        tail = f"; the {_plural(skipped, 'draft')} after it {'are' if skipped != 1 else 'is'} dropped unverified"
        lines.append(f"- **Reject:** {tok(t.text)}: {why}{tail if skipped else ''}")
    e = r.emitted
    if e is not None:
        if e.kind == "correction":
            src = "the target's argmax" if greedy else f"the residual max(0, p − q) (prob {e.p:.2f})"
            lines.append(f"- **Correct:** {tok(e.text)}, {src}")
        elif r.k == 0:
            lines.append(f"- **Target step:** with nothing to verify, the pass is a plain target step: "
                         f"{tok(e.text)} (prob {e.p:.2f})")
        else:
            lines.append(f"- **Bonus:** all drafts passed, so {tok(e.text)} comes free from the target's last "
                         f"distribution (prob {e.p:.2f})")
    return lines


def _tree_draft_line(r: Round) -> str:
    depth = max((n.depth for n in r.tree), default=0)
    wide = sum(n.rank > 0 for n in r.tree)
    return (f"- **Draft:** grew a tree of {_plural(len(r.tree), 'node')}, {depth} deep, in {ms(r.draft_time)}: "
            f"the draft's most likely paths, with {_plural(wide, 'second-or-later candidate')} where it was unsure")


def _tree_verdict_lines(r: Round, greedy: bool) -> list[str]:
    """Each sibling try in walk order: a rejected candidate is ruled out of p before the next is tried."""
    tried = [n for n in r.tree if n.accept_prob is not None]
    tried.sort(key=lambda n: (n.depth, n.rank))  # the walk goes down one path, trying siblings in rank order
    lines = []
    for n in tried:
        rule = "the target's argmax?" if greedy else f"u = {n.u:.2f} vs p(x) / (mass left) = {n.accept_prob:.2f}"
        if n.status == ACCEPTED:
            lines.append(f"- **Try** {tok(n.text)} (depth {n.depth}): {rule} → accepted, go down into it")
        else:
            lines.append(f"- **Try** {tok(n.text)} (depth {n.depth}): {rule} → rejected; p without it, "
                         f"renormalised, for the next sibling")
    e = r.emitted
    if e is not None:
        how = ("every candidate there was rejected: drawn from what is left of p" if e.kind == "correction"
               else "the accepted path ended at a leaf: drawn from the target's distribution there")
        lines.append(f"- **{e.kind.capitalize()}:** {tok(e.text)}, {how} (prob {e.p:.2f})")
    return lines


def step_caption(r: Round, greedy: bool, stage: str = "done") -> str:
    """What happened in one round, with its numbers: draft → verify → accept/correct (a tree round: the walk).

    stage "draft" and "verify" stop early (step mode reveals a round in three steps)."""
    tree = bool(r.tree)
    lines = [f"**Round {r.index + 1}** ({r.drafter} drafter)", _tree_draft_line(r) if tree else _draft_line(r)]
    if stage == "draft":
        upcoming = ("the target scores every node in one forward pass (a tree mask: each node sees only its own "
                    "path)…" if tree else "the target checks them all in one forward pass…")
        return "\n".join(lines + [f"- **Verify:** next, {upcoming}"])
    scored = (f"all {len(r.tree)} nodes (+1 position)" if tree
              else f"all {r.k} drafts (+1 position)" if r.k else "the next position")
    lines.append(f"- **Verify:** the target scored {scored} in one pass: {ms(r.verify_time)}")
    if stage == "verify":
        upcoming = ("**Walk:** next, from the root, each node's candidates tried in turn…" if tree
                    else "**Accept / correct:** next, u against min(1, p/q) for each draft, left to right…")
        return "\n".join(lines + [f"- {upcoming}"])
    lines += _tree_verdict_lines(r, greedy) if tree else _verdict_lines(r, greedy)
    done = f" · finished ({r.finished})" if r.finished else ""
    lines.append(f"- **Net:** {_plural(r.tokens_emitted, 'token')} for one target forward{done}")
    return "\n".join(lines)


def _x(v: float | None, fmt: str = "{:.2f}×") -> str:
    return "—" if v is None else fmt.format(v)


def stats_markdown(s: RunStats, source: str) -> str:
    sp = s.spec
    if not sp.rounds:
        return "*Statistics appear after a run.*"
    cost = s.cost
    if s.ar is not None:
        target = f"{ms(s.ar.step_s)} per target step (measured: target alone)"
    else:
        used = cost.target_step_s if cost else 0.0
        target = f"{ms(used)} per verify pass, used as the target step (the race measures it)"
    if s.speedup is not None:
        measured = f"**{_x(s.speedup)}** ({sp.tokens_per_s:.1f} vs {s.ar.tokens_per_s:.1f} tokens/s" + (
            f"; {s.speedup / s.predicted_speedup:.2f} of the prediction)" if s.predicted_speedup else ")")
    else:
        measured = "— (press **Run race** to measure against the target alone)"
    return "\n".join([
        f"**{source}** · {sp.tokens} tokens in {sp.rounds} rounds · {sp.seconds:.2f} s of compute · "
        f"{sp.tokens_per_s:.1f} tokens/s",
        "",
        "| measure | value |",
        "|---|---|",
        f"| acceptance rate (accepted ÷ drafted) | {sp.acceptance_rate:.2f} ({sp.accepted} / {sp.drafted}) |",
        f"| α̂ (accepted ÷ tested drafts) | {s.alpha:.2f} |",
        f"| tokens per target forward | {sp.mean_accepted_tokens:.2f} |",
        f"| ĉ (draft step ÷ target step) | {_x(cost.c if cost else None, '{:.2f}')} ({ms(sp.draft_step_s)} per draft "
        f"token; {target}) |",
        f"| predicted speedup (from α̂, K, ĉ) | {_x(s.predicted_speedup)} (E = {_x(s.expected_tokens, '{:.2f}')} "
        f"tokens per round at K = {s.k}, from the per-position α̂) |",
        f"| measured speedup | {measured} |",
    ])


def race_caveats(shared_cpu: bool, finishes: tuple, timing_note: str | None = None) -> list[str]:
    """What a reader of a race's numbers must know: its timing did not hold, another job shared the CPU, or the
    budget cut it short."""
    out = [f"⚠ {timing_note}"] if timing_note else []
    if shared_cpu:
        out.append("⚠ Another job (a replay, or a page being rendered) used the CPU during this race: both clocks "
                   "may include some of its time, so the speedup is less certain than usual.")
    if "budget" in finishes:
        out.append("⏱ The race reached the server's time budget per request: the lanes stopped there, and the "
                   "numbers cover the tokens shown.")
    return out


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds // 60:.0f} min {seconds % 60:.0f} s"


def queue_line(w) -> str:
    """A job's place in the model's queue (`serving.turns.Waiting`), and how long it will likely wait."""
    when = (f"about {duration(w.estimate_s)} (from the measured durations of the jobs ahead and the running "
            "one's pace)" if w.estimate_s is not None else "no estimate yet: no job like those ahead has finished")
    if w.background and w.position == 1:  # only the app's own warm-up is ahead, and it yields at its next event
        return ("Waiting for the model: the app is recording its examples in the background, and stops for you at "
                "its next token; yours starts in a moment.")
    return (f"Waiting for the model: number {w.position} in line, {w.ahead} ahead of you (the one running "
            f"included); {when}. Run again to change your request: it takes this one's place.")


def recorded_note(recorded_at: float) -> str:
    """What a recorded answer is, in one sentence a visitor can trust."""
    return (f"Recorded at {clock_time(recorded_at)} on this server: the same request (prompt, settings, seed, "
            "pair) ran then, and these are that run's events and numbers, streamed at its pace.")
