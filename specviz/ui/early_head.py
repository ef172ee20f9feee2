"""The page's own script placed first in the HTML head, before Gradio's modules run (an ASGI middleware).

Gradio adds `launch(head=...)` to the page from its JavaScript once its modules have loaded, and by then they hold
the browser's requestAnimationFrame: a hook given there (`ui.live.HEAD`, which makes the hidden elapsed-time counters
of pending outputs tick once a second, not every frame) saw 6 of the ~530 ticks one idle page made in 10 s (headless
Chromium on a 2-core AMD EPYC Zen 4, where that page took 0.08-0.16 of a core from the cores a race is timed on).
Served in the HTML itself, it runs before any module.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class EarlyHead:
    """Insert `html` right after the first <head> of the page at "/" (a whole, uncompressed HTML response)."""

    def __init__(self, app: ASGIApp, html: str):
        self.app, self.html = app, html.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or scope["path"] != "/":
            await self.app(scope, receive, send)
            return
        start: list[Message] = []
        body: list[bytes] = []

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.append(message)
                return
            if message["type"] != "http.response.body" or not start:
                await send(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            await send_whole(send, start[0], early(b"".join(body), start[0], self.html))

        await self.app(scope, receive, sending)


def early(page: bytes, start: Message, html: bytes) -> bytes:
    """The page with `html` after its <head>, where it is HTML and not compressed; else as it was."""
    headers = MutableHeaders(scope=start)
    if not headers.get("content-type", "").startswith("text/html") or "content-encoding" in headers:
        return page
    return page.replace(b"<head>", b"<head>" + html, 1)


async def send_whole(send: Send, start: Message, page: bytes) -> None:
    MutableHeaders(scope=start)["content-length"] = str(len(page))
    await send(start)
    await send({"type": "http.response.body", "body": page})
