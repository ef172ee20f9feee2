"""The tree drafter: the draft model grows a token tree under a node budget, EAGLE-2 style.

Depth by depth, the `width` most likely nodes of the newest depth (by path probability, the product of the draft's
probabilities down the path) are read by the draft in one batched forward (a tree mask over its cache), and
each offers its `width` most likely next tokens as children. Finally the `budget` nodes of highest path
probability are kept: a child's path probability is at most its parent's, so they form a tree. Only nodes among
the `budget` best so far are read (no other could have a child in the tree), so where the draft is sure the tree
is a chain and each depth costs one token's forward, as a chain's draft does.

The children are chosen deterministically (the draft's top tokens), so the rule treats each as a point mass
(`siblings.try_siblings` with q = None): exact under greedy and sampling alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specviz.engine.drafters import ModelDrafter
from specviz.compat import forward
from specviz.engine.plumbing import PromptCache, model_dtype
from specviz.engine.sampling import SamplingParams, logits_to_probs
from specviz.engine.tree import additive_mask, keep_path

TREE_WIDTH = 4  # children per expanded node, and nodes expanded per depth (EAGLE-2's top-k)


@dataclass
class DraftTree:
    parents: list[int] = field(default_factory=list)  # each node's parent (-1: a child of the root); parents first
    tokens: list[int] = field(default_factory=list)
    q: list[float] = field(default_factory=list)  # the draft's probability of the node where it was proposed
    q_soft: list[float] = field(default_factory=list)  # the same at temperature 1
    slots: list[int] = field(default_factory=list)  # where the draft read the node in its cache (after the
    # committed tokens), -1 if it did not (a leaf)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)  # row 0: the root, 1 + i: node i: the
    # draft's top candidates there, (token, q); empty for a node the draft did not read

    @property
    def n(self) -> int:
        return len(self.parents)


@dataclass
class _Candidate:
    token: int
    parent: int  # index among the candidates, -1: the root
    score: float  # log path probability
    q: float
    q_soft: float
    slot: int = -1
    top: list[tuple[int, float]] = field(default_factory=list)


class TreeDrafter(ModelDrafter):
    name = "tree"
    static = False  # it reorders its cache (`keep_path`): a dynamic one

    def __init__(self, model, sampling: SamplingParams, vocab_size: int, width: int = TREE_WIDTH,
                 prompt_cache: PromptCache | None = None, cut: float = 0.0):
        """`cut`: the adaptive modes' confidence cut, as the chain's: the draft reads on below a node only when
        it gave that node's token at least this probability (0: wherever the budget allows)."""
        super().__init__(model, sampling, None, vocab_size, prompt_cache=prompt_cache)
        self.width, self.cut, self.past = width, cut, 0

    def log_q(self, logits: torch.Tensor) -> torch.Tensor:
        """Log probabilities the tree is ranked by: the warped q when sampling, the softmax when greedy."""
        if self.sampling.greedy:
            return torch.log_softmax(logits, -1)
        return logits_to_probs(logits, self.sampling).log()

    def children(self, logits: torch.Tensor, parents: list[int], cands: list[_Candidate]) -> list[int]:
        """Add each parent's top `width` next tokens as candidates (one host transfer); their indices."""
        logits = self.scores(logits.float())
        log_q = self.log_q(logits)
        vals, idx = log_q.topk(min(self.width, log_q.shape[-1]), dim=-1)
        soft = torch.log_softmax(logits, -1).gather(-1, idx)
        vals, idx, soft = vals.tolist(), idx.tolist(), soft.tolist()
        new = []
        for row, parent in enumerate(parents):
            base = 0.0 if parent < 0 else cands[parent].score
            top = [(t, math.exp(v)) for t, v in zip(idx[row], vals[row]) if v > -math.inf]
            if parent >= 0:
                cands[parent].top = top
            for t, v, s in zip(idx[row], vals[row], soft[row]):
                if v > -math.inf:  # a token the warps removed is never proposed
                    new.append(len(cands))
                    cands.append(_Candidate(t, parent, base + v, math.exp(v), math.exp(s)))
        return new

    @torch.inference_mode()
    def grow(self, ids: torch.Tensor, depth: int, budget: int) -> DraftTree:
        """A tree of at most `budget` nodes and `depth` levels after the committed tokens `ids`."""
        out = forward(self.model, self.context(ids), self.cache, 1)
        self.past = self.cache.get_seq_length()
        if depth == 0 or budget == 0:
            return DraftTree(tops=[[]])
        cands: list[_Candidate] = []
        level = self.children(out.logits[0, -1:], [-1], cands)
        root_top = [(c.token, c.q) for c in (cands[i] for i in level)]
        read: list[int] = []  # candidates the draft has read, in cache order
        for d in range(1, depth):
            # a node's children can end among the `budget` best only if it is among them now (more candidates
            # only push it down, and they score no higher than it): the draft reads only such nodes
            kth = sorted((c.score for c in cands), reverse=True)[:budget][-1]
            frontier = sorted((i for i in level if cands[i].score >= kth and cands[i].q >= self.cut),
                              key=lambda i: -cands[i].score)[:self.width]
            if not frontier:
                break
            logits = self.read(frontier, cands, read, d, ids.device)
            level = self.children(logits, frontier, cands)
        return self.select(cands, budget, root_top)

    def read(self, frontier: list[int], cands: list[_Candidate], read: list[int], depth: int, device) -> torch.Tensor:
        """One draft forward over the frontier nodes (depth `depth`): each sees the committed tokens, the
        nodes on its path and itself. Returns their logits [len(frontier), V]."""
        visible = torch.zeros(len(frontier), len(read) + len(frontier), dtype=torch.bool)
        for row, i in enumerate(frontier):
            cands[i].slot = len(read) + row
            node = i
            while node >= 0:
                visible[row, cands[node].slot] = True
                node = cands[node].parent
        read += frontier
        mask = additive_mask(visible, self.past, model_dtype(self.model), device)
        positions = torch.full((1, len(frontier)), self.past - 1 + depth, device=device)
        tokens = torch.tensor([[cands[i].token for i in frontier]], device=device)
        out = forward(self.model, self.fit(tokens), self.cache, len(frontier), attention_mask=mask,
                      position_ids=positions)
        return out.logits[0, -len(frontier):]

    @staticmethod
    def select(cands: list[_Candidate], budget: int, root_top: list[tuple[int, float]]) -> DraftTree:
        """The `budget` candidates of highest path probability (ties: the earlier, so a parent comes before
        its children), in candidate order: parents first."""
        best = sorted(sorted(range(len(cands)), key=lambda i: (-cands[i].score, i))[:budget])
        index = {c: n for n, c in enumerate(best)}
        tree = DraftTree(tops=[root_top])
        for i in best:
            c = cands[i]
            tree.parents.append(-1 if c.parent < 0 else index[c.parent])  # KeyError: not a tree (cannot be)
            tree.tokens.append(c.token), tree.q.append(c.q), tree.q_soft.append(c.q_soft)
            tree.slots.append(c.slot), tree.tops.append(c.top)
        return tree

    def keep(self, tree: DraftTree, path: list[int]) -> None:
        """Keep the accepted path in the draft's cache: the nodes it read, which lead the path (a read node's
        parent was read too); the rest of the path is read next round with the new token."""
        read = [tree.slots[i] for i in path]
        read = read[:next((j for j, s in enumerate(read) if s < 0), len(read))]
        keep_path(self.cache, self.past, read)
