"""docs/reference/api.md: every JSON endpoint, from the functions `specviz.api.endpoints.register` adds to a Blocks
(their signatures and descriptions, as `gradio_client`'s `view_api()` reads them)."""

from __future__ import annotations

import inspect
import os
import re
import types
from dataclasses import dataclass
from typing import Literal, Union, get_args, get_origin

from docsgen.markdown import banner, cell


@dataclass(frozen=True)
class Endpoint:
    name: str
    fn: object
    description: str
    queue: str  # which queue it waits in


def served_endpoints() -> list[Endpoint]:
    """The endpoints `register` adds to a Blocks, on a stand-in session that allows switching the pair (so that
    /load_pair is listed too) and with a share page (so that /share_html is)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    import gradio as gr

    from specviz.api import endpoints
    from specviz.settings.limits import Limits

    with gr.Blocks() as demo:
        endpoints.register(types.SimpleNamespace(allow_switch=True), Limits(), page=lambda trace: "")
    queues = {endpoints.MODEL: "the model's queue: one run at a time", endpoints.REPLAY: "beside the model, one at a time"}
    out = []
    for f in demo.fns.values():
        doc = " ".join((f.api_description or inspect.getdoc(f.fn) or "").split())
        out.append(Endpoint(f.api_name, f.fn, doc, queues.get(f.concurrency_id, "none: answered at once")))
    return out


def type_text(annotation) -> str:
    if annotation is inspect.Parameter.empty:
        return "–"
    if isinstance(annotation, str):  # postponed (from __future__ import annotations)
        return annotation.replace("|", "\\|")
    if get_origin(annotation) is Literal:
        return " \\| ".join(repr(a) for a in get_args(annotation))
    if get_origin(annotation) in (Union, types.UnionType):
        return " \\| ".join(type_text(a) for a in get_args(annotation))
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def parameter_help(description: str, names: list[str]) -> tuple[str, dict[str, str]]:
    """An endpoint's description split into its text and each parameter's line (`describe` writes them as
    "Parameters: name (type, range; default ...): help; next (...): ...")."""
    text, _, listed = description.partition(" Parameters: ")
    helps = {}
    listed = listed.removesuffix(".")
    present = [n for n in names if re.search(rf"(^|; ){re.escape(n)} \(", listed)]
    for i, name in enumerate(present):
        start = re.search(rf"(^|; ){re.escape(name)} \(", listed).end() - 1
        nxt = re.search(rf"; {re.escape(present[i + 1])} \(", listed) if i + 1 < len(present) else None
        helps[name] = meaning(listed[start:nxt.start() if nxt else len(listed)].strip())
    return text, helps


def meaning(described: str) -> str:
    """`(int, between 1 and 16; default 8): help` as `between 1 and 16: help` (type and default have columns of
    their own; choices are the type)."""
    m = re.fullmatch(r"\((?P<what>.*?); default .*?\): (?P<help>.*)", described, re.S)
    if not m:
        return described
    what = re.sub(r"^(int|float|str|bool)(, )?", "", m["what"])
    return f"{what}: {m['help']}" if what and "'" not in what else m["help"]


def returns_text(fn) -> str:
    text = type_text(inspect.signature(fn).return_annotation)
    if inspect.isgeneratorfunction(fn):
        inner = re.fullmatch(r"Iterator\[(.*)\]", text)
        return f"a stream of `{inner[1] if inner else 'dict'}` messages, the last one the result"
    return f"`{text}`"


def endpoint_section(e: Endpoint) -> list[str]:
    """One endpoint's heading, text, return and parameter table."""
    params = [p for p in inspect.signature(e.fn).parameters.values() if p.name != "request"]
    text, helps = parameter_help(e.description, [p.name for p in params])
    lines = [f"## `/{e.name}`", "", text, "", f"Returns: {returns_text(e.fn)}.", ""]
    if not params:
        return [*lines, "No parameters.", ""]
    lines += ["| parameter | type | default | range and meaning |", "|---|---|---|---|"]
    lines += [f"| `{p.name}` | {type_text(p.annotation)} | "
              f"{'required' if p.default is inspect.Parameter.empty else f'`{p.default!r}`'} | "
              f"{cell(helps.get(p.name, ''))} |" for p in params]
    return [*lines, ""]


def api_page(endpoints: list[Endpoint]) -> str:
    lines = [banner("the endpoints in specviz/api/endpoints.py (`register`)").rstrip(), "", "# JSON API reference", "",
             "Generated from the functions the app registers as named endpoints: their signatures are what "
             "`gradio_client` sends and `client.view_api()` shows, their parameters come from the settings specs, and "
             "every input is validated like the app's controls. How to call them, what they stream and return: "
             "[The JSON API](../api.md).", "",
             "| endpoint | streams | queue |", "|---|---|---|"]
    lines += [f"| [`/{e.name}`](#{e.name}) | {'yes' if inspect.isgeneratorfunction(e.fn) else 'no'} "
              f"| {e.queue} |" for e in endpoints]
    lines.append("")
    for e in endpoints:
        lines += endpoint_section(e)
    return "\n".join(lines).rstrip() + "\n"
