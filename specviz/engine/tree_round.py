"""Tree speculation's round loop: grow a draft tree -> the target reads every node in one forward -> walk it.

The same round as `speculative.py`, with a tree where the chain was: the draft offers several candidates where
it is unsure (`tree_drafter.py`), the target scores the whole tree in one forward (a tree mask,
`tree.py`), and the walk from the root tries each node's children in turn with the point-mass rule
(`siblings.py`), down into the accepted one, ending on a correction or a bonus. Both caches then keep only the
accepted path. Per round: one draft forward per depth, one target forward, two host transfers (the walk needs
the target's probability of every node; the event needs the token it drew after).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from specviz.engine.events import (
    ACCEPTED, BONUS, CORRECTION, NOT_VERIFIED, REJECTED, Candidate, DraftedToken, Finish, Round, TreeNode,
    end_of_run, until_eos,
)
from specviz.compat import forward, model_vocab
from specviz.engine.plumbing import (
    Phases, Pieces, PromptCache, at, clock, fit_ids, model_dtype, pad_vocab, prefilled, to_host,
)
from specviz.engine.sampling import draw, logits_to_probs, make_generator
from specviz.engine.siblings import TreeVerdict, walk_point_masses, without
from specviz.engine.tokens import candidates, emitted_token, target_stats, top
from specviz.engine.tree import depths, keep_path, tree_mask, tree_positions
from specviz.engine.tree_drafter import DraftTree, TreeDrafter

# (parents, p(x) of each node, the draft's q(x) of each node, one uniform per node) -> (verdict, nodes tried);
# only the proof's negative controls pass another rule than the point-mass walk (`speculative.Rule`)
TreeRule = Callable[[list[int], list[float], list[float], list[float]], tuple]


def point_mass_rule(parents, p_at, q_at, u):
    return walk_point_masses(parents, p_at, u)


@dataclass(frozen=True)
class Walked:
    """A tree round once the target has read it and the walk is done: what its event is built from."""

    tree: DraftTree
    verdict: TreeVerdict
    tried: list[int]  # the nodes the walk tried, in order
    host: dict  # per node: p and p_soft in its parent's row, its u; per row: the target's top-2 gap and top candidates
    last: dict  # the token drawn after the path: next, next_p, next_p_soft, and what it was drawn from's top ("r")
    end: int  # the row after the path: 0 (the root's) or 1 + the path's last node


@torch.inference_mode()
def tree_generate(pair, prompt_ids: list[int], config, *, prompt_cache: PromptCache | None = None,
                  should_stop: Callable[[], Finish] = lambda: None, rule: TreeRule = point_mass_rule,
                  drafter: TreeDrafter | None = None) -> Iterator[Round]:
    """Rounds of tree speculation: K caps the tree's depth, `config.tree_budget` its nodes, and the confidence
    cut (in the modes that have one) where it grows deeper, as it ends a chain. `drafter`: another
    width than the default (tests); `rule`: only the proof's negative controls pass another."""
    device, greedy = pair.device, config.sampling.greedy
    gen = make_generator(device, config.seed)
    sizes = model_vocab(pair.target), pair.vocab_size  # the target's embedding rows, and the vocabulary worked in
    drafter = drafter or TreeDrafter(pair.draft, config.sampling, sizes[1], prompt_cache=prompt_cache, cut=config.cut)
    pieces = Pieces(pair.tokenizer)
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    generated: list[int] = []
    t0 = clock(device)
    # a compiled target's static cache, sized for the run and one tree past it (`keep_path` reorders either kind)
    cache = prefilled(pair.target, ids, prompt_cache, room=config.max_new_tokens + config.tree_budget + 1)
    drafter.prefill(ids)
    prefill_time = clock(device) - t0
    for index in range(config.max_new_tokens):
        phases = Phases(device)
        phases.mark()
        tree = drafter.grow(ids, min(config.k, config.max_new_tokens - len(generated) - 1), config.tree_budget)
        phases.mark()
        nodes = torch.tensor([tree.tokens], dtype=torch.long, device=device)
        logits = _read_tree(pair, ids, cache, tree, nodes, sizes)
        p = logits_to_probs(logits, config.sampling)
        host = to_host(**_node_stats(tree, nodes[0], logits, p, gen, config))
        verdict, tried = rule(tree.parents, host["p_at"], tree.q, host["u"])
        end, next_dist = _after_path(p, tree, verdict, tried)
        nxt = draw(next_dist, next_dist, greedy, gen)
        phases.mark()
        last = to_host(next=nxt, next_p=at(next_dist, nxt), next_p_soft=at(torch.softmax(logits[end], -1), nxt),
                       **top(next_dist[None], config.top_n, "r"))
        new = until_eos([tree.tokens[i] for i in verdict.path] + [int(last["next"])], pair.eos_token_ids)
        position = len(generated)
        generated += new
        finished = end_of_run(new, len(generated), pair.eos_token_ids, config.max_new_tokens, should_stop)
        # both caches keep the committed tokens plus the accepted path; the new token is read next round
        keep_path(cache, ids.shape[1], verdict.path)
        drafter.keep(tree, verdict.path)
        ids = torch.cat([ids, torch.tensor([new], dtype=torch.long, device=device)], dim=1)
        event = _tree_event(Walked(tree, verdict, tried, host, last, end), new, pieces, greedy, index=index,
                            drafter=drafter.name, position=position, text=pieces.text(generated), finished=finished)
        phases.mark()
        event.draft_time, event.verify_time, event.overhead_time = phases.seconds()
        event.prefill_time, prefill_time = prefill_time, 0.0
        yield event
        if finished:
            return


def _read_tree(pair, ids: torch.Tensor, cache, tree: DraftTree, nodes: torch.Tensor,
               sizes: tuple[int, int]) -> torch.Tensor:
    """The target's one forward over the committed tokens its cache lacks and then every node (`tree_mask`): its
    logits, row 0 after the committed tokens (the root's children), row 1 + i after node i. `sizes`: the target's
    embedding rows and the vocabulary the run works in."""
    past = cache.get_seq_length()
    pending = ids.shape[1] - past
    rows, vocab = sizes
    feed = torch.cat([ids[:, past:], fit_ids(nodes, rows)], dim=1)
    out = forward(pair.target, feed, cache, tree.n + 1,
                  attention_mask=tree_mask(tree.parents, pending, past, model_dtype(pair.target), pair.device),
                  position_ids=tree_positions(tree.parents, pending, past, pair.device))
    return pad_vocab(out.logits[0, -(tree.n + 1):].float(), vocab)


def _after_path(p: torch.Tensor, tree: DraftTree, verdict: TreeVerdict, tried: list[int]) -> tuple[int, torch.Tensor]:
    """The row after the accepted path, and what its token is drawn from: p there after a bonus; after a rejection
    what is left of p once the children tried there are ruled out (the point-mass residual)."""
    end = verdict.path[-1] + 1 if verdict.path else 0
    if verdict.bonus:
        return end, p[end]
    left = without(p[end], [tree.tokens[i] for i in tried if tree.parents[i] == end - 1])
    return end, torch.where(left.sum() > 0, left, p[end])  # nothing left: a rejection by rounding


def _node_stats(tree: DraftTree, nodes: torch.Tensor, logits, p, gen, config) -> dict[str, torch.Tensor]:
    """What the walk and the event need, on the device: p and the softmax at each node in its parent's row,
    one uniform per node (none when greedy: the rule is then deterministic), and per row the target's top-2
    gap and top candidates."""
    rows = torch.tensor([parent + 1 for parent in tree.parents], dtype=torch.long, device=p.device)
    p_soft, target = target_stats(logits, p, config.sampling.greedy, config.top_n)
    u = torch.zeros(tree.n, device=p.device) if config.sampling.greedy else torch.rand(
        tree.n, generator=gen, device=p.device)
    return dict(p_at=p[rows, nodes], p_soft_at=p_soft[rows, nodes], u=u, **target)


def _tree_event(w: Walked, new: list[int], pieces, greedy: bool, **fields) -> Round:
    """The Round: every node of the tree, and as `drafted` the path the target followed."""
    path = w.verdict.path
    kept = min(len(path), len(new))  # an end-of-sequence may cut the path short
    accepted = set(path[:kept])
    nodes = _nodes(w, accepted, pieces, greedy)
    # before a correction every child of the path's end was tried and rejected: show the first
    corrected = len(new) > len(path) and not w.verdict.bonus
    shown = path[:kept] + ([next(i for i in w.tried if w.tree.parents[i] == w.end - 1)] if corrected else [])
    drafted = [_drafted(w, i, nodes[i], pieces, rejected=i not in accepted) for i in shown]
    emitted = emitted_token(w.host, w.end, new[-1], BONUS if w.verdict.bonus else CORRECTION, w.last["next_p"],
                            w.last["next_p_soft"], pieces) if len(new) > len(path) else None
    return Round(k=len(drafted), drafted=drafted, n_accepted=kept, emitted=emitted, new_token_ids=new,
                 draft_time=0.0, verify_time=0.0, overhead_time=0.0, tree=nodes, **fields)  # times: read once built


def _nodes(w: Walked, accepted: set[int], pieces, greedy: bool) -> list[TreeNode]:
    """Every node of the tree with its verdict: accepted (on the kept path), rejected (tried), or never verified."""
    tree, tries = w.tree, dict(zip(w.tried, w.verdict.tries))
    level, p = depths(tree.parents), w.host["p_soft_at" if greedy else "p_at"]
    nodes = []
    for i, parent in enumerate(tree.parents):
        t = tries.get(i)
        status = ACCEPTED if i in accepted else REJECTED if t is not None and not t.accepted else NOT_VERIFIED
        nodes.append(TreeNode(
            id=tree.tokens[i], text=pieces(tree.tokens[i]), parent=parent, depth=level[i],
            rank=tree.parents[:i].count(parent), q=tree.q[i], p=p[i],
            status=status, accept_prob=None if t is None else t.accept_prob, u=None if t is None else t.u))
    return nodes


def _drafted(w: Walked, i: int, node: TreeNode, pieces, rejected: bool) -> DraftedToken:
    """Node i as a drafted token of the path: a point mass (q = 1) for the rule, its siblings' story in the tree."""
    tree, h = w.tree, w.host
    row = tree.parents[i] + 1
    return DraftedToken(
        id=node.id, text=node.text, q=1.0, p=h["p_at"][i], accept_prob=node.accept_prob, u=node.u,
        status=REJECTED if rejected else ACCEPTED, q_soft=tree.q_soft[i], p_soft=h["p_soft_at"][i],
        target_top2_gap=h["gap"][row], q_top=[Candidate(t, pieces(t), q) for t, q in tree.tops[row]],
        p_top=candidates(h, "p", row, pieces), residual_top=candidates(w.last, "r", 0, pieces) if rejected else [])
