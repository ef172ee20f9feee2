"""Record a real server pair's answers as test fixtures (tests/data/engines/<engine>-<version>/).

    .venv/bin/python scripts/capture_engine_fixtures.py [--engine llamacpp|vllm] [--build DIR] [--port 18281]

Starts the two servers `specviz engines llamacpp` (or `vllm`) starts (the embedded pair; the target alone, and the
target with its draft at K = 4), and for each records verbatim: its info pages (llama-server: GET /props, /slots;
vLLM: /version), /v1/models, /metrics before, one streamed chat completion of the first shipped prompt with
max_tokens 8 (the raw SSE bytes), and /metrics after. The commands the servers ran and the request body go to
commands.json beside them. Nothing here is timed.
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import httpx

from specviz.commands.engines import load_prompts
from specviz.engine.config import DecodeConfig
from specviz.remote import llama_server, llamacpp, vllm, vllm_server
from specviz.remote.stream import chat_body

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "engines"
ENGINES = {  # engine: (version, its info pages, its request extras, its servers)
    "llamacpp": (llama_server.VERSION, ("/props", "/slots"), llamacpp.extra_body,
                 lambda args: llama_server.llama_servers(
                     llama_server.LlamaSettings(port=args.port, k=4, threads=2, ctx=2048), args.build)),
    "vllm": (vllm_server.VERSION, ("/version",), vllm.extra_body,
             lambda args: vllm_server.vllm_servers(vllm_server.VllmSettings(port=args.port, k=4), progress=print)),
}


def capture(client: httpx.Client, url: str, lane: str, body: dict, pages: tuple[str, ...], out: Path) -> None:
    for path in (*pages, "/v1/models"):
        (out / f"{lane}-{path.strip('/').replace('/', '-').removeprefix('v1-')}.json").write_bytes(
            client.get(url + path).content)
    (out / f"{lane}-metrics-before.txt").write_bytes(client.get(url + "/metrics").content)
    with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        (out / f"{lane}-stream.sse").write_bytes(b"".join(response.iter_bytes()))
    time.sleep(1)  # (a server may count a request's drafts just after its last event)
    (out / f"{lane}-metrics-after.txt").write_bytes(client.get(url + "/metrics").content)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--build")
    parser.add_argument("--port", type=int, default=18281)
    parser.add_argument("--engine", choices=tuple(ENGINES), default="llamacpp")
    parser.add_argument("--spec", metavar="URL", help="servers already started by `specviz engines ...`: the target "
                                                      "with its draft (and --plain: the target alone)")
    parser.add_argument("--plain", metavar="URL")
    args = parser.parse_args()
    version, pages, extra_body, servers_of = ENGINES[args.engine]
    out = DATA / f"{args.engine}-{version}"
    out.mkdir(parents=True, exist_ok=True)
    config = DecodeConfig(max_new_tokens=8, seed=0)
    prompt = load_prompts(None, 1)[0][0]
    running = SimpleNamespace(spec_url=args.spec, plain_url=args.plain, commands=("(already running)",) * 2)
    with (nullcontext(running) if args.spec and args.plain else servers_of(args)) as servers, \
            httpx.Client(timeout=600, trust_env=False) as client:
        for lane, url in (("spec", servers.spec_url), ("plain", servers.plain_url)):
            model = client.get(url + "/v1/models").json()["data"][0]["id"]
            body = chat_body(prompt.prompt, config, model, extra_body(config))
            capture(client, url, lane, body, pages, out)
        (out / "commands.json").write_text(json.dumps({
            "servers": {"plain": servers.commands[0], "spec": servers.commands[1]},
            "request": body, "capture": "scripts/capture_engine_fixtures.py"}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
