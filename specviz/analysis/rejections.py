"""Rejected drafts: what each cost its round, and each as a record to distil or fine-tune the draft on.

A rejection loses the rejected draft and every draft after it in its round (never verified): the work
the round threw away. `record` keeps what a distillation needs at the rejected position: the context (the
prompt's tokens and every token emitted before it), the token the draft proposed and the one the target
emitted instead, and both models' top candidates there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from specviz.engine.events import REJECTED, Round, Step


@dataclass(frozen=True)
class PromptRun:
    """One prompt's run, as the Atlas reads it."""

    id: str
    kind: str
    prompt: str
    prompt_ids: tuple[int, ...]
    rounds: tuple[Round, ...]
    greedy: bool = True
    steps: tuple[Step, ...] = ()  # the target alone, when it raced
    measured_speedup: float | None = None  # its race: speculative tokens/s over the target alone's
    finished: str | None = None  # eos | length | stopped | budget


def chain_rounds(run: PromptRun) -> list[Round]:
    """Rounds whose drafts are a chain (a tree round's `drafted` is only the path its walk took)."""
    return [r for r in run.rounds if r.drafter != "tree"]


@dataclass(frozen=True)
class Rejection:
    run: PromptRun
    round: Round
    index: int  # in the round's drafts

    @property
    def lost(self) -> int:
        """The rejected draft and the drafts after it, which the round threw away."""
        return len(self.round.drafted) - self.index

    @property
    def position(self) -> int:
        """In the generated sequence."""
        return self.round.position + self.index


def rejections(runs) -> list[Rejection]:
    """Every rejected draft whose correction made it into the output, in run and round order."""
    return [Rejection(run, r, i) for run in runs for r in chain_rounds(run)
            for i, t in enumerate(r.drafted) if t.status == REJECTED and r.emitted is not None]


def record(rej: Rejection) -> dict:
    """One line of `--export-rejections`: JSON-ready."""
    r, t, run = rej.round, rej.round.drafted[rej.index], rej.run
    emitted = [tok for each in run.rounds for tok in each.new_token_ids][:rej.position]  # this round's accepted too
    context = [*run.prompt_ids, *emitted]
    return {
        "prompt_id": run.id, "kind": run.kind, "round": r.index, "position": rej.position, "greedy": run.greedy,
        "context_ids": context, "prompt_tokens": len(run.prompt_ids),
        "drafted": {"id": t.id, "text": t.text}, "emitted": {"id": r.emitted.id, "text": r.emitted.text},
        "tokens_lost": rej.lost,
        "q": t.q, "p": t.p, "q_soft": t.q_soft, "p_soft": t.p_soft, "q_entropy": t.q_entropy,
        "draft_top": [asdict(c) for c in t.q_top], "target_top": [asdict(c) for c in t.p_top],
    }
