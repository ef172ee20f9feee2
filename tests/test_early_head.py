"""The page's own script is served first in the HTML's <head>, before Gradio's modules (`ui.early_head`); nothing
else the server answers changes."""

from __future__ import annotations

import gzip

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from specviz.ui.early_head import EarlyHead

PAGE = '<!doctype html><html><head><script type="module" src="./assets/index.js"></script></head><body></body></html>'
SCRIPT = "<script>window.early = 1;</script>"


def client(page: Response) -> TestClient:
    routes = [Route("/", lambda request: page), Route("/config", lambda request: JSONResponse({"head": "<head>"}))]
    return TestClient(Starlette(routes=routes, middleware=[Middleware(EarlyHead, html=SCRIPT)]))


def test_the_script_comes_first_in_the_head_with_the_length_counted():
    answer = client(HTMLResponse(PAGE)).get("/")
    assert answer.text.startswith("<!doctype html><html><head>" + SCRIPT + '<script type="module"')
    assert answer.text.count(SCRIPT) == 1
    assert int(answer.headers["content-length"]) == len(answer.content) == len(PAGE) + len(SCRIPT)


def test_other_answers_are_left_as_they_are():
    assert client(HTMLResponse(PAGE)).get("/config").json() == {"head": "<head>"}
    packed = gzip.compress(PAGE.encode())
    answer = client(Response(packed, media_type="text/html", headers={"content-encoding": "gzip"})).get("/")
    assert SCRIPT not in answer.text  # a compressed page is not searched (it would not be found)
    assert client(Response(PAGE, media_type="text/plain")).get("/").text == PAGE


def test_the_served_app_puts_its_script_before_gradios_modules(server):
    import httpx

    page = httpx.get(server.client.src).text
    from specviz.ui.live import HEAD

    assert 0 <= page.index(HEAD) < page.index('<script type="module"')
