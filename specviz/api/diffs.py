"""What a streaming endpoint sends between two of its results: Gradio's edit list, with its list deletions right.

Gradio (6.31) streams a generator's results as edits of the previous one (`gradio.utils.diff`); its clients apply
them in order, so a list's shortening is sent as deletions of the same index, one after another. Gradio makes that
index by shifting each deletion by the deletions before it, but it shifts every deletion in the edits gathered so far,
those inside the list's elements too: where an element's own list shortens in the same result as the outer list (a
round's drafted tokens, one of them with fewer residual candidates than the token at its place a round before), the
inner deletion is shifted again, its index goes wrong or negative, and the client fails (`IndexError` in
gradio_client's `apply_diff`) or keeps the wrong elements. `diff` makes the same edits, each list's deletions shifted
at their own level only; `server.build_server` has Gradio use it.
"""

from __future__ import annotations

from gradio import utils

GRADIO = utils.diff  # Gradio's own, as imported (the tests' control)


def diff(old, new) -> list[list]:
    """The edits that turn `old` into `new`, in the order and form of Gradio's `utils.diff`."""
    return _edits(old, new, [])


def _edits(a, b, path: list) -> list[list]:
    if a == b:
        return []
    if type(a) is not type(b):
        return [["replace", path, b]]
    if isinstance(a, str) and b.startswith(a):
        return [["append", path, b[len(a):]]]
    if isinstance(a, list):
        common = min(len(a), len(b))
        edits = [e for i in range(common) for e in _edits(a[i], b[i], path + [i])]
        edits += [["delete", path + [common], None] for _ in range(common, len(a))]  # each shifts the rest down
        return edits + [["add", path + [i], b[i]] for i in range(common, len(b))]
    if isinstance(a, dict):
        edits = []
        for key in a:
            edits += _edits(a[key], b[key], path + [key]) if key in b else [["delete", path + [key], None]]
        return edits + [["add", path + [key], b[key]] for key in b if key not in a]
    return [["replace", path, b]]
