"""Checks shared by test modules (importable because pyproject puts tests/ on pytest's pythonpath)."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch

from specviz.engine import DecodeConfig
from specviz.engine.events import ACCEPTED, BONUS, CORRECTION, NOT_VERIFIED, REJECTED, round_from_dict
from specviz.serving.quiet import Quiet
from specviz.serving.turns import BACKGROUND
from specviz.settings.limits import budget

# Where the engine's tests run their pairs: cpu and float32 unless set. On a lent GPU scripts/gpu_check.sh runs
# them with SPECVIZ_TEST_DEVICE=cuda, once in float32 and once with SPECVIZ_TEST_DTYPE=bfloat16.
TEST_DEVICE = torch.device(os.environ.get("SPECVIZ_TEST_DEVICE", "cpu"))
TEST_DTYPE = getattr(torch, os.environ.get("SPECVIZ_TEST_DTYPE", "float32"))
EXACT = TEST_DTYPE == torch.float32  # two computations of one token agree to rounding: greedy outputs are equal

# the tests' pace: a shown view's page work is not waited for (a test of that wait sets its own)
NO_WAIT = Quiet(cap=0.0)

NEAR_TIE = 0.25  # a top-2 logit gap bf16's rounding (~3 significant digits over ~30 layers of sums) can close


def same_greedy(tokens: list[int], steps, exact: bool = EXACT) -> bool:
    """Greedy speculation's tokens against the target alone's `steps` (autoregressive `Step` events): equal in
    float32. In a lower precision the target's one-token step and its verify over K + 1 rows round differently,
    so the two may part, but only where the target alone's top two logits were a near-tie. `exact`: whether they
    must be equal (the suite's dtype says, unless a test runs a pair in another)."""
    alone = [s.token.id for s in steps]
    if tokens == alone or exact:
        return tokens == alone
    first = next((i for i, (a, b) in enumerate(zip(tokens, alone)) if a != b), min(len(tokens), len(alone)))
    return first < len(steps) and steps[first].token.target_top2_gap < NEAR_TIE


def on_test_device(pair):
    """`pair` (its models moved in place) on the suite's device and in its dtype."""
    def move(model):
        return None if model is None else model.to(TEST_DEVICE, TEST_DTYPE)

    return replace(pair, draft=move(pair.draft), target=move(pair.target), device=TEST_DEVICE, dtype=TEST_DTYPE)


def spec_tokens(rounds) -> list[int]:
    return [t for r in rounds for t in r.new_token_ids]


def check_rounds(pair, rounds, config: DecodeConfig, tree: bool = False) -> None:
    """Every invariant a consumer relies on, for one complete run. `tree`: rounds of the tree drafter, whose
    drafted tokens are point masses tried after siblings (their accept probability: `check_tree_rounds`)."""
    generated: list[int] = []
    for i, r in enumerate(rounds):
        assert r.index == i and r.k == len(r.drafted)
        assert r.k <= config.k and r.k <= config.max_new_tokens - len(generated) - 1
        statuses = "".join({ACCEPTED: "A", REJECTED: "R", NOT_VERIFIED: "N"}[d.status] for d in r.drafted)
        assert re.fullmatch("A*R?N*", statuses), statuses
        assert r.n_accepted == statuses.count("A")
        accepted = [d.id for d in r.drafted[:r.n_accepted]]
        if r.emitted is None:  # only an end-of-sequence among the accepted drafts drops the correction/bonus
            assert r.finished == "eos" and accepted and accepted[-1] in pair.eos_token_ids and "R" not in statuses
        else:
            assert r.emitted.kind == (CORRECTION if "R" in statuses else BONUS)
            assert (r.emitted.kind == BONUS) == (r.n_accepted == r.k)
        assert r.new_token_ids == accepted + ([r.emitted.id] if r.emitted else [])
        assert r.position == len(generated)
        generated += r.new_token_ids
        assert r.text == pair.tokenizer.decode(generated, skip_special_tokens=True)
        assert min(r.draft_time, r.verify_time, r.overhead_time) >= 0
        for d in r.drafted[:r.n_accepted + ("R" in statuses)]:  # the tokens the rule decided
            if not tree:
                assert d.accept_prob == pytest.approx(min(1.0, d.p / d.q) if d.q > 0 else 1.0, rel=1e-5, abs=1e-6)
            assert (d.u < d.accept_prob) == (d.status == ACCEPTED)
            assert 0 <= d.u < 1
        for t in [*r.drafted, *([r.emitted] if r.emitted else [])]:
            assert math.isfinite(t.target_top2_gap) and t.target_top2_gap >= 0
            assert len(t.p_top) <= config.top_n
        if config.sampling.greedy:  # point masses: accepted tokens are the target's argmax, rejected are not
            assert all(d.p == 1.0 for d in r.drafted[:r.n_accepted])
            assert all(d.p == 0.0 for d in r.drafted if d.status == REJECTED)
        assert round_from_dict(json.loads(json.dumps(r.to_dict()))) == r
        assert (r.finished is not None) == (i == len(rounds) - 1)
    assert len(generated) <= config.max_new_tokens
    assert not any(t in pair.eos_token_ids for t in generated[:-1])  # nothing after an end-of-sequence
    last = rounds[-1].finished
    assert (last == "eos") == (generated[-1] in pair.eos_token_ids)
    if last == "length":
        assert len(generated) == config.max_new_tokens


def other_family(model, rows: list[int | None], noise: float, seed: int):
    """A draft "of another family" made from `model`: its vocabulary's id d is the model's token rows[d] (None:
    a token of its own, with random weights), every weight with noise. It predicts much as the model does, in
    other ids: the tests' stand-in for a real cross-tokenizer pair, with a known mapping between the two."""
    import torch
    from torch import nn

    from specviz.models.tiny import noisy_copy

    draft = noisy_copy(model, noise, seed)
    hf = hasattr(draft, "lm_head")  # an HF causal LM, or tests' CausalLM (`embed`, `head` with a bias)
    embed, head = (draft.model.embed_tokens, draft.lm_head) if hf else (draft.embed, draft.head)
    gen = torch.Generator().manual_seed(seed)

    def pick(weight: torch.Tensor) -> torch.Tensor:
        new = [weight[r] if r is not None else weight.std() * torch.randn(weight.shape[1:], generator=gen)
               for r in rows]
        return torch.stack(new)

    with torch.no_grad():
        new_embed = nn.Embedding.from_pretrained(pick(embed.weight), freeze=False)
        new_head = nn.Linear(head.in_features, len(rows), bias=head.bias is not None)
        new_head.weight.copy_(pick(head.weight))
        if head.bias is not None:
            new_head.bias.copy_(pick(head.bias[:, None])[:, 0])
    if hf:
        draft.model.embed_tokens, draft.lm_head = new_embed, new_head
    else:
        draft.embed, draft.head = new_embed, new_head
    draft.config.vocab_size = len(rows)  # (a deep copy's config: the model's own is untouched)
    return draft.eval()


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def deprecations_said() -> Iterator[list[str]]:
    """Everything said to be deprecated while the block ran, as text (read it after the block): each FutureWarning and
    DeprecationWarning, whoever raised it (transformers' `deprecate_kwarg` warns from the frame that called the
    model, torch's module code: the filename does not say whose), but torch's own from compiling (`torch.jit`); and
    what transformers' logger warned meanwhile (its `warning_once`, for a cache passed to or read from an output by
    its old name)."""
    said, lines = [], _Lines()
    logger = logging.getLogger("transformers")
    logger.addHandler(lines)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield said
    finally:
        logger.removeHandler(lines)
    said += [f"{w.category.__name__}: {w.message}" for w in caught if issubclass(
        w.category, (FutureWarning, DeprecationWarning)) and not str(w.message).startswith("`torch.")]
    said += [line for line in lines.lines if "deprecated" in line]


@contextmanager
def tables_kept_at(threads: int) -> Iterator[None]:
    """Tuning within reads the kernel table kept for `threads` (`make app`'s, all of the machine's threads) where the
    thread count it runs at has none kept; where neither is kept, it measures at its own count, as the app does.
    A test that needs *a* plan (the invariant kernels compute the same bits on any plan) then skips minutes of timing
    a pytest-xdist worker's one thread; the app's own rule, a table per thread count, is unchanged."""
    from specviz.models import kernels
    from specviz.models.kernel_table import read_keyed, table_path

    measured_here = kernels.kept_or_measured

    def kept_or_measured(path, key, *args, **kwargs):
        other = replace(key, threads=threads)
        if read_keyed(path, key) is None and (kept := read_keyed(table_path(other, path.parent), other)) is not None:
            return kept, True
        return measured_here(path, key, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "kept_or_measured", kept_or_measured)
        yield


def slow_target(session, monkeypatch, module, seconds: float) -> list[float]:
    """Each target forward costs `seconds` of a fake clock, and the budget `module` gives a request reads that
    clock: the budget ends a run after the same forwards on any machine, however loaded (no sleeps, no wall
    clock). Returns the clock, [now]."""
    now = [0.0]
    forward = session.pair.target.forward

    def slow(*args, **kwargs):
        now[0] += seconds
        return forward(*args, **kwargs)

    monkeypatch.setattr(session.pair.target, "forward", slow)
    monkeypatch.setattr(module, "budget", lambda limit: budget(limit, clock=lambda: now[0]))
    return now


def warm_up_while_a_visitor_waits(turns) -> bool:
    """Is the model's holder the app's own warm-up while a visitor's job waits? Read from the queue itself, not
    from `Turns.visitor_waiting`: that is the product's answer the warm-up yields by, which the tests check."""
    queue = list(turns.queue)
    return bool(queue) and queue[0].owner == BACKGROUND and any(t.owner != BACKGROUND for t in queue)
