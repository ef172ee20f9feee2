"""Token spans: a token's text made visible and its hover line, the pieces every HTML view is built from."""

from __future__ import annotations

from html import escape

from specviz.engine.events import BONUS, CORRECTION, TARGET, EmittedToken

DRAFTED = "drafted"  # step mode, before the verdict is shown


def visible(text: str) -> str:
    """Escape a token's text and make whitespace that would vanish visible."""
    if text and not text.strip(" "):
        return f'<span class="sv-ws">{"·" * len(text)}</span>'  # a token made only of spaces
    out = []
    for ch in text:
        if ch == "\n":
            out.append('<span class="sv-ws">↵</span>\n')
        elif ch == "\t":
            out.append('<span class="sv-ws">→</span>\t')
        elif ch == "\r":
            out.append('<span class="sv-ws">␍</span>')
        else:
            out.append(escape(ch))
    return "".join(out)


def emitted_tip(t: EmittedToken) -> str:
    where = {CORRECTION: "sampled from the residual max(0, p − q)",
             BONUS: "sampled from the target's next distribution (all drafts accepted)",
             TARGET: "sampled by the target alone"}[t.kind]
    lines = [f"{t.kind}: {t.text!r}", where, f"probability = {t.p:.4f}", f"p (softmax, T=1) = {t.p_soft:.4f}",
             f"target top-2 logit gap = {t.target_top2_gap:.3f}"]
    if not t.draftable:
        lines.append("not in the draft model's vocabulary (another family): the draft model could not propose it")
    return "\n".join(lines)


def token_span(text: str, cls: str, tip: str, extra: str = "") -> str:
    return f'<span class="sv-tok sv-{cls}{extra}" title="{escape(tip)}">{visible(text)}</span>'


def emitted_span(t: EmittedToken, extra: str = "") -> str:
    """A token the target chose; dotted when the draft's vocabulary lacks it."""
    return token_span(t.text, t.kind, emitted_tip(t), extra + ("" if t.draftable else " sv-undraftable"))
