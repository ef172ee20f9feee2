"""The round loop at full acceptance: how much the engine itself loses per round.

A drafter that runs the real draft model's K steps (so a round pays the draft's true cost) but proposes the
target's own greedy continuation, recorded beforehand, as point masses: greedy verification then accepts
every drafted token, whatever the weights (random ones included), and each round emits K + 1 tokens. Against
the cost model's ideal for the rounds that ran, tokens · T1 / Σ (K·draft + T(K+1)), the measured rate says
what the loop adds on top of the model forwards: the host transfer, Python, building the events.

The recording comes from the target alone's one-token steps, and the verify reads K + 1 tokens at once. In
float32 the rule accepts every recorded token (tested). In bf16 the two round differently, and random weights
make near-ties common (a synthetic Qwen2.5-1.5B's top two logits: median gap 0.125), so some recorded tokens are
not the verify's argmax: the timed run keeps every draft whatever the rule decides (`KEEP_EVERY_DRAFT`, after
the rule's full work), and reports how often the verify's argmax agreed with the recording.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from specviz.analysis.predict import CostModel, predicted_speedup_for_rounds
from specviz.engine import DecodeConfig, autoregressive_generate, speculative_generate
from specviz.engine.drafters import Draft, ModelDrafter, point_mass_draft
from specviz.engine.plumbing import at
from specviz.engine.rules import Verdict, verify
from specviz.engine.sampling import SamplingParams, draw, make_generator
from specviz.engine.speculative import Rule
from specviz.models.compiled import CompileCounts
from specviz.bench.syncs import counting_host_reads


def keep_every_draft(p, q, tokens, generator, greedy: bool = False) -> Verdict:
    """The real rule's work (its cost is the round's), then every draft kept and the bonus drawn from p's last row."""
    verdict = verify(p, q, tokens, generator, greedy)
    k = tokens.shape[0]
    bonus = draw(p[k], p[k], greedy, generator)
    # (a fill, not torch.tensor: a copy from the host's pageable memory would wait for the device's queue first)
    kept = torch.full((), k, dtype=torch.long, device=p.device)
    return replace(verdict, n_accepted=kept, next_token=bonus, next_prob=at(p[k], bonus))


# the rule the timed run verifies with; no tree form: the forced drafter is a chain's
KEEP_EVERY_DRAFT = Rule("keep every draft", keep_every_draft)


class ForcedDrafter:
    """The draft model's steps, the target's recorded continuation as the proposal (see the module's doc)."""

    name = "model"

    def __init__(self, inner: ModelDrafter, continuation: list[int], prompt_len: int, vocab_size: int,
                 device: torch.device):
        self.inner, self.prompt_len, self.vocab_size = inner, prompt_len, vocab_size
        # on the device once: a round's proposal is then a slice, with no copy from the host (each would wait for
        # the device to finish the draft's steps, a stall the real drafter does not have)
        self.continuation = torch.tensor(continuation, dtype=torch.long, device=device)

    def prefill(self, ids: torch.Tensor, room: int = 0) -> None:
        self.inner.prefill(ids, room)

    def propose(self, ids: torch.Tensor, history: list[int], k: int) -> Draft:
        drafted = self.inner.propose(ids, history, k)  # the draft's true cost: its k steps
        start = len(history) - self.prompt_len
        forced = point_mass_draft(self.continuation[start:start + drafted.k], self.vocab_size, ids.device)
        return Draft(forced.tokens, forced.q, drafted.logits[:forced.k])

    def rollback(self, keep: int) -> None:
        self.inner.rollback(keep)


@dataclass(frozen=True)
class ForcedRun:
    k: int
    tokens: int
    rounds: int
    argmax_agreement: float  # drafted tokens that were the verify's argmax (1.0 in float32; in bf16 near-ties part)
    decode_s: float  # wall seconds of the rounds, as the consumer sees them (prompt excluded)
    draft_s: float  # of which in the drafter (the events' draft_time, summed)
    verify_s: float  # in the target's verify and the rule
    event_s: float  # in the round's statistics, host transfer and event (overhead_time)
    ideal_tokens_per_s: float  # the cost model's rate for these rounds: no engine overhead at all
    target_alone_tokens_per_s: float  # the target alone's loop over the same tokens, measured beside it
    host_syncs_per_round: float = 0.0  # reads of device values by the host (`syncs.py`), the prompt's round out
    host_syncs_per_ar_token: float = 0.0  # the same in the target alone's loop, per token after the first
    compiles: int = 0  # graphs torch compiled in either timed loop: 0, or the rates are no measure
    cudagraph_skips: int = 0  # graphs that ran without CUDA graphs in either loop (launch-bound again)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.decode_s

    @property
    def speedup(self) -> float:
        """Over the target alone's loop, timed in the same run: what full acceptance buys, measured."""
        return self.tokens_per_s / self.target_alone_tokens_per_s

    @property
    def efficiency(self) -> float:
        """Measured / ideal: 1.0 means the loop adds nothing to the model forwards as the cost model prices them
        (timed apart, minutes earlier: on a CPU whose speed drifts, this drifts with it)."""
        return self.tokens_per_s / self.ideal_tokens_per_s

    @property
    def overhead_ms_per_round(self) -> float:
        """Milliseconds of each round outside the drafter and the verify, measured in the run itself: the round's
        statistics and host transfer, building its event, cutting the caches, Python."""
        return 1e3 * (self.decode_s - self.draft_s - self.verify_s) / self.rounds


def timed_events(events, device: torch.device) -> tuple[list, float, int, CompileCounts]:
    """All events of a run; the wall seconds spent producing them after the first (which read the prompt), the
    host reads meanwhile, and the graphs compiled or skipped meanwhile."""
    it = iter(events)
    first = [next(it)]
    before = CompileCounts.now()
    with counting_host_reads(device) as reads:
        t0 = time.perf_counter()
        rest = list(it)
        seconds = time.perf_counter() - t0
    return first + rest, seconds, reads[0], CompileCounts.now().since(before)


def forced_run(pair, prompt: list[int], k: int, new_tokens: int, cost: CostModel) -> ForcedRun:
    """The round loop at K with every draft accepted (see the module's doc), the target alone beside it. Neither
    stops at an end-of-text token: a real model given the costs' arbitrary prompt may write one at once, and a
    step costs the same after it."""
    pair = replace(pair, eos_token_ids=frozenset())
    greedy = DecodeConfig(k=k, max_new_tokens=new_tokens + k + 1, adaptive="fixed")
    steps, alone_s, ar_reads, ar_compiles = timed_events(autoregressive_generate(pair, prompt, greedy),
                                                         pair.device)  # the recording, timed
    continuation = [s.token.id for s in steps]
    config = DecodeConfig(k=k, max_new_tokens=new_tokens, adaptive="fixed")
    inner = ModelDrafter(pair.draft, SamplingParams(0.0), make_generator(pair.device, 0), pair.vocab_size)
    drafter = ForcedDrafter(inner, continuation, len(prompt), pair.vocab_size, pair.device)
    rounds, decode_s, reads, compiles = timed_events(speculative_generate(pair, prompt, config, drafter=drafter,
                                                                          rule=KEEP_EVERY_DRAFT), pair.device)
    timed = rounds[1:]  # as `decode_s`: the first round's wall time includes reading the prompt
    tokens = sum(len(r.new_token_ids) for r in timed)
    drafted = sum(r.k for r in rounds)
    ideal = predicted_speedup_for_rounds([r.k for r in timed], tokens, cost) / cost.target_step_s
    return ForcedRun(k=k, tokens=tokens, rounds=len(timed),
                     argmax_agreement=sum(d.p == 1.0 for r in rounds for d in r.drafted) / drafted if drafted else 1.0,
                     decode_s=decode_s, draft_s=sum(r.draft_time for r in timed),
                     verify_s=sum(r.verify_time for r in timed), event_s=sum(r.overhead_time for r in timed),
                     ideal_tokens_per_s=ideal, target_alone_tokens_per_s=(len(steps) - 1) / alone_s,
                     host_syncs_per_round=reads / len(timed), host_syncs_per_ar_token=ar_reads / (len(steps) - 1),
                     compiles=compiles.graphs + ar_compiles.graphs,
                     cudagraph_skips=compiles.cudagraph_skips + ar_compiles.cudagraph_skips)
