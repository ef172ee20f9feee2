"""A tree round drawn as branches: pure functions from a `Round` with a draft tree to HTML (no models, no Gradio).

Each node is a token span coloured by its outcome (accepted path in green, rejected siblings struck through in
red, never-tried nodes grey); the correction or bonus hangs below the last accepted node. Hovering a node shows
its p, q, rank among its siblings and, when tried, its accept probability and u.
"""

from __future__ import annotations

from html import escape

from specviz.engine.events import ACCEPTED, NOT_VERIFIED, REJECTED, Round, TreeNode
from specviz.engine.siblings import children_of
from specviz.ui.spans import DRAFTED, emitted_span, token_span

CSS = """
.sv-tree { margin-top: 8px; padding: 6px 10px; border: 1px solid var(--border-color-primary); border-radius: 8px;
  font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 13px; line-height: 1.7; }
.sv-tree h5 { margin: 0 0 4px; font-size: 13px; font-family: var(--font); }
.sv-tree ul { list-style: none; margin: 0; padding-left: 18px; border-left: 1px solid rgba(100, 116, 139, 0.4); }
.sv-tree > ul { border-left: none; padding-left: 0; }
.sv-tree li { white-space: nowrap; }
.sv-tree li::before { content: "─ "; color: rgba(100, 116, 139, 0.6); }
.sv-tree .sv-path > .sv-tok { font-weight: 700; }
.sv-tree .sv-meta { color: var(--body-text-color-subdued); font-size: 11px; margin-left: 6px; }
"""


def node_tip(n: TreeNode, greedy: bool) -> str:
    lines = [f"{n.status.replace('_', ' ')}: {n.text!r} (depth {n.depth}, sibling {n.rank + 1})",
             f"p = {n.p:.4f}, q = {n.q:.4f}" + (" (softmax, T=1)" if greedy else "")]
    if n.accept_prob is None:
        lines.append("not tried: the walk never reached it (an earlier sibling was accepted, or its parent "
                     "was rejected)")
    else:
        lines.append(f"tried: accept with p(x) / (p's mass left after the siblings before it) = {n.accept_prob:.4f}")
        lines.append("greedy: accepted iff it is the target's argmax" if greedy else f"u = {n.u:.4f}")
    return "\n".join(lines)


def tree_html(r: Round, greedy: bool, stage: str = "done") -> str:
    """The round's draft tree; stage "draft" shows the proposal before the verdict (step mode)."""
    children = children_of([n.parent for n in r.tree])
    path = {i for i, n in enumerate(r.tree) if n.status == ACCEPTED}
    end = max(path, default=-1)  # the deepest accepted node: parents come before their children

    def branch(parent: int) -> str:
        items = []
        for i in children.get(parent, []):
            n = r.tree[i]
            cls = DRAFTED if stage == "draft" else n.status
            meta = f"q {n.q:.2f}" if stage == "draft" else f"p {n.p:.2f} · q {n.q:.2f}"
            items.append(f'<li class="{"sv-path" if i in path and stage != "draft" else ""}">'
                         f'{token_span(n.text, cls, node_tip(n, greedy))}<span class="sv-meta">{meta}</span>'
                         f'{branch(i)}</li>')
        if parent == end and r.emitted is not None and stage != "draft":
            items.append(f'<li class="sv-path">{emitted_span(r.emitted)}'
                         f'<span class="sv-meta">{r.emitted.kind}</span></li>')
        return f"<ul>{''.join(items)}</ul>" if items else ""

    tried = sum(n.status != NOT_VERIFIED for n in r.tree)
    rejected = sum(n.status == REJECTED for n in r.tree)
    depth = max((n.depth for n in r.tree), default=0)
    title = (f"Round {r.index + 1}: a draft tree of {len(r.tree)} nodes, {depth} deep, verified in one forward"
             + ("" if stage == "draft" else f" · {tried} tried, {rejected} rejected, {len(path)} accepted"))
    return f'<div class="sv-tree" id="sv-tree"><h5>{escape(title)}</h5>{branch(-1)}</div>'


def latest_tree_html(rounds: list[Round], greedy: bool) -> str:
    """The newest tree round's branches ("" when there is none): a run's last round may have room for one token
    only, and no tree."""
    latest = next((r for r in reversed(rounds) if r.tree), None)
    return "" if latest is None else tree_html(latest, greedy)
