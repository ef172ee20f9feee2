"""The speculative decoding round loop: draft K -> verify all in one target forward -> accept/correct.

Each round yields a `Round` event. Per round there is one target forward and one host transfer;
both KV caches are cropped back to the accepted prefix, so the prefix is never recomputed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from specviz.engine.config import DecodeConfig, next_k
from specviz.engine.acceptance import AcceptanceModel, shipped_model, token_features
from specviz.engine.cuts import StopRule, confidence_cut, predicted_cut
from specviz.engine.drafters import NEEDS_DRAFT_MODEL, Draft, Drafter, make_drafter
from specviz.engine.events import (
    ACCEPTED, BONUS, CORRECTION, NOT_VERIFIED, REJECTED, DraftedToken, Finish, Round, end_of_run, until_eos,
)
from specviz.compat import forward, model_vocab
from specviz.engine.plumbing import (
    Phases, Pieces, PromptCache, at, clock, fit_ids, pad_vocab, prefilled, rollback, to_host,
)
from specviz.engine.rules import Verdict, overlap, verify
from specviz.engine.sampling import logits_to_probs, make_generator
from specviz.engine.tokens import candidates, emitted_token, entropy, target_stats, top
from specviz.engine.tree_round import TreeRule, point_mass_rule, tree_generate


class DrafterError(RuntimeError):
    """A drafter broke its contract: every proposed token must have q(x) > 0 under the q it reports."""


ChainRule = Callable[..., Verdict]  # (p, q, tokens, generator, greedy=) -> Verdict, as `rules.verify`


@dataclass(frozen=True)
class Rule:
    """The accept/reject rule a run verifies with, by name: `EXACT` (`rules.verify`, and for a tree the point-mass
    walk), every real run's; or one broken on purpose, where a run must show the break (the proof's negative
    controls, `runs.proof.ALWAYS_ACCEPT`; the forced bench's keep-every-draft). A chain's rule and a tree's travel
    together, so a control runs with any drafter; `tree=None`: no tree form, and a tree run refuses the rule."""

    name: str
    chain: ChainRule
    tree: TreeRule | None = None


EXACT = Rule("exact", verify, point_mass_rule)


def tree_form(rule: Rule) -> TreeRule:
    """What a tree run verifies with under `rule`; one sentence where the rule has no tree form."""
    if rule.tree is None:
        raise ValueError(f"the {rule.name!r} rule has no tree form: use it with a chain drafter, not 'tree'.")
    return rule.tree


@torch.inference_mode()
def speculative_generate(pair, prompt_ids: list[int], config: DecodeConfig, *,
                         drafter: Drafter | None = None, prompt_cache: PromptCache | None = None,
                         should_stop: Callable[[], Finish] = lambda: None, rule: Rule = EXACT,
                         acceptance_model: AcceptanceModel | None = None) -> Iterator[Round]:
    """`rule`: the rule the run verifies with (`Rule`; `EXACT` but for the proof's negative controls and the forced
    bench). `acceptance_model`: predicts each drafted token's acceptance (shown in the events; the 'predicted' mode's
    cut uses it); the fit shipped with specviz by default."""
    if config.drafter == "tree":  # a tree where the chain was: its own round loop, with the rule's tree form
        yield from tree_generate(pair, prompt_ids, config, prompt_cache=prompt_cache, should_stop=should_stop,
                                 rule=tree_form(rule))
        return
    device, gen = pair.device, make_generator(pair.device, config.seed)
    predictor = acceptance_model or shipped_model()
    if drafter is None:
        drafter = make_drafter(config, pair, gen, drafting_stop(config, predictor, device), prompt_cache)
    # a draft model of another family proposes only the tokens it shares with the target: mark the others
    mapping = pair.vocab_map if drafter.name in NEEDS_DRAFT_MODEL else None
    pieces = Pieces(pair.tokenizer)
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    history, generated, k = list(prompt_ids), [], config.k
    sizes = model_vocab(pair.target), pair.vocab_size  # the target's embedding rows, and the vocabulary worked in
    cache, prefill_time = _prefilled(pair, drafter, ids, prompt_cache, config.room)
    for index in range(config.max_new_tokens):
        phases = Phases(device)
        phases.mark()
        # never draft more than can be emitted: k accepted + 1 correction/bonus <= tokens left
        draft = drafter.propose(ids, history, min(k, config.max_new_tokens - len(generated) - 1))
        phases.mark()
        logits, p, verdict = _verified(pair, ids, cache, draft, config, rule.chain, gen, sizes)
        phases.mark()
        # from here on, the work is for the event (display statistics, host transfer, texts): overhead
        host = _truthful(to_host(**_round_stats(draft, logits, p, verdict, config)), drafter.name)
        n = int(host["n"])
        new = until_eos([int(t) for t in host["tokens"][:n]] + [int(host["next"])], pair.eos_token_ids)
        position = len(generated)
        generated += new
        history += new
        finished = end_of_run(new, len(generated), pair.eos_token_ids, config.max_new_tokens, should_stop)
        # both caches keep the context plus the accepted drafts; the new token is fed next round
        keep = ids.shape[1] + n
        rollback(cache, keep)
        drafter.rollback(keep)
        ids = torch.cat([ids, torch.tensor([new], dtype=torch.long, device=device)], dim=1)
        event = _round_event(host, n, new, draft.k, pieces, predictor, index=index, drafter=drafter.name,
                             position=position, text=pieces.text(generated), finished=finished)
        if mapping is not None and event.emitted is not None:
            event.emitted.draftable = mapping.draftable(event.emitted.id)
        phases.mark()  # building the event is part of the overhead
        event.draft_time, event.verify_time, event.overhead_time = phases.seconds()
        event.prefill_time, prefill_time = prefill_time, 0.0
        yield event
        if finished:
            return
        k = next_k(config, k, draft.k, n)


def _prefilled(pair, drafter: Drafter, ids: torch.Tensor, prompt_cache: PromptCache | None, room: int):
    """Both models read the prompt: the target's cache, and the seconds the reading took."""
    t0 = clock(pair.device)
    cache = prefilled(pair.target, ids, prompt_cache, room=room)
    drafter.prefill(ids, room)
    return cache, clock(pair.device) - t0


def _verified(pair, ids: torch.Tensor, cache, draft: Draft, config: DecodeConfig, rule: ChainRule, gen,
              sizes: tuple[int, int]):
    """The round's one target forward, over the committed tokens its cache lacks and the K drafts, and the rule's
    verdict on them: the target's logits and warped p (K + 1 rows), and the verdict. `sizes`: the target's
    embedding rows and the vocabulary the run works in (read once a run)."""
    rows, vocab = sizes
    drafted = draft.tokens if rows == vocab else fit_ids(draft.tokens, rows)
    feed = torch.cat([ids[:, cache.get_seq_length():], drafted[None]], dim=1)
    out = forward(pair.target, feed, cache, draft.k + 1)
    # the last k+1 rows, whatever a model (or a wrapper) made of logits_to_keep
    logits = pad_vocab(out.logits[0, -(draft.k + 1):].float(), vocab)
    p = logits_to_probs(logits, config.sampling)
    return logits, p, rule(p, draft.q, draft.tokens, gen, greedy=config.sampling.greedy)


def _truthful(host: dict, drafter: str) -> dict:
    """The round's host values, once each drafted token's q is seen to be positive (`DrafterError` otherwise)."""
    if any(qx <= 0 for qx in host["q"]):
        raise DrafterError(f"the {drafter} drafter proposed a token its own q gives no probability; "
                           "its q is not the distribution it sampled from.")
    return host


def _round_stats(draft, logits, p, verdict, config) -> dict[str, torch.Tensor]:
    """Everything the round's event shows, computed on the device so it crosses to the host in one go."""
    k, greedy, top_n = draft.k, config.sampling.greedy, config.top_n
    n, nxt = verdict.n_accepted, verdict.next_token
    p_soft, target = target_stats(logits, p, greedy, top_n)
    q_soft = torch.softmax(draft.logits, -1)
    idx = draft.tokens[:, None]
    return dict(
        tokens=draft.tokens, n=n, next=nxt, next_p=verdict.next_prob, next_p_soft=at(at(p_soft, n), nxt),
        accept_prob=verdict.accept_prob, u=verdict.u,
        q=draft.q.gather(-1, idx).squeeze(-1), p=p[:k].gather(-1, idx).squeeze(-1), beta=_beta(draft, logits, p),
        q_soft=q_soft.gather(-1, idx).squeeze(-1), p_soft=p_soft[:k].gather(-1, idx).squeeze(-1),
        q_entropy=entropy(draft.logits, q_soft),
        **target, **top(q_soft if greedy else draft.q, top_n, "q"),  # the shown q: greedy's point mass says little
        **top(verdict.drawn_from[None], top_n, "r"),  # where the correction came from (the rejected row's)
    )


def _beta(draft, logits, p) -> torch.Tensor:
    """Each drafted position's β from the same warped p and q the rule used (a seam: a test's mutant swaps it)."""
    return overlap(p[:draft.k], draft.q)


def drafting_stop(config: DecodeConfig, predictor: AcceptanceModel, device: torch.device | None = None
                  ) -> StopRule | None:
    """What ends a round's drafting before K: the adaptive mode's cut, if it has one; applied once a round after
    drafting all K where a host read stalls the device (`cut_once`), else as it drafts."""
    once = cut_once(device)
    if config.adaptive == "confidence":
        return confidence_cut(config.confidence, once)
    if config.adaptive == "predicted":
        return predicted_cut(predictor, config.confidence, config.drafter, config.top_n, once)
    return None


def cut_once(device: torch.device | None) -> bool:
    """On a CPU a host read costs nothing and the draft steps past the cut are real work: cut as it drafts. Measured
    on a 2-core AMD EPYC Zen 5 (the embedded pair, bf16, greedy, K 8, cut 0.4, 6 shipped prompts twice): as it
    drafts 19.9 tok/s at 4.8 host reads a round, once a round 15.9 tok/s at 2.0 (0.80x). On a GPU each read stops
    the host from queueing the next draft steps: cut once (a prediction until a lent GPU measures it)."""
    return device is not None and device.type == "cuda"


def _round_event(h, n, new, k, pieces, predictor: AcceptanceModel, **fields) -> Round:
    """The Round for host values `h`; `fields` (index, drafter, position, text, times, finished) pass through."""
    drafted = []
    kept = min(n, len(new))  # drafted tokens in the output: an end-of-sequence may cut the round short
    for i in range(k):
        if i < kept:
            status = ACCEPTED
        elif i == n and len(new) > n:  # the rejection whose correction made it into the output
            status = REJECTED
        else:  # after a rejection, or past the end of the output
            status = NOT_VERIFIED
        tid = int(h["tokens"][i])
        token = DraftedToken(
            id=tid, text=pieces(tid), q=h["q"][i], p=h["p"][i], accept_prob=h["accept_prob"][i], u=h["u"][i],
            status=status, q_soft=h["q_soft"][i], p_soft=h["p_soft"][i], target_top2_gap=h["gap"][i],
            q_top=candidates(h, "q", i, pieces), p_top=candidates(h, "p", i, pieces),
            residual_top=candidates(h, "r", 0, pieces) if status == REJECTED else [],
            q_entropy=h["q_entropy"][i], beta=h["beta"][i],
        )
        token.predicted = predictor.predict(token_features(token, i, fields["drafter"]))
        drafted.append(token)
    # the correction/bonus, when it made it into the output
    emitted = emitted_token(h, n, new[n], CORRECTION if n < k else BONUS, h["next_p"], h["next_p_soft"],
                            pieces) if len(new) > n else None
    return Round(k=k, drafted=drafted, n_accepted=kept, emitted=emitted, new_token_ids=new,
                 draft_time=0.0, verify_time=0.0, overhead_time=0.0, **fields)  # the times: read once it is built
