"""Record a real llama-server pair's answers as test fixtures (tests/data/engines/llamacpp-<version>/).

    .venv/bin/python scripts/capture_engine_fixtures.py [--build DIR] [--port 18281]

Starts the two servers `specviz engines llamacpp` starts (the embedded pair; the target alone, and the target
with its draft at K = 4), and for each records verbatim: GET /props, /slots, /v1/models, /metrics before, one
streamed chat completion of the first shipped prompt with max_tokens 8 (the raw SSE bytes), and /metrics after.
The commands the servers ran and the request body go to commands.json beside them. Nothing here is timed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx

from specviz.engine.config import DecodeConfig
from specviz.engines.command import load_prompts
from specviz.engines.llama_server import VERSION, llama_servers
from specviz.engines.llamacpp import extra_body
from specviz.engines.stream import chat_body

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "engines" / f"llamacpp-{VERSION}"


def capture(client: httpx.Client, url: str, lane: str, body: dict) -> None:
    for path, name in (("/props", "props.json"), ("/slots", "slots.json"), ("/v1/models", "models.json"),
                       ("/metrics", "metrics-before.txt")):
        (OUT / f"{lane}-{name}").write_bytes(client.get(url + path).content)
    with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        (OUT / f"{lane}-stream.sse").write_bytes(b"".join(response.iter_bytes()))
    (OUT / f"{lane}-metrics-after.txt").write_bytes(client.get(url + "/metrics").content)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--build")
    parser.add_argument("--port", type=int, default=18281)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    config = DecodeConfig(max_new_tokens=8, seed=0)
    prompt = load_prompts(None, 1)[0][0]
    with llama_servers(args.build, args.port, k=4, threads=2, ctx=2048) as servers, \
            httpx.Client(timeout=600, trust_env=False) as client:
        for lane, url in (("spec", servers.spec_url), ("plain", servers.plain_url)):
            model = client.get(url + "/v1/models").json()["data"][0]["id"]
            body = chat_body(prompt.text, config, model, extra_body(config))
            capture(client, url, lane, body)
        (OUT / "commands.json").write_text(json.dumps({
            "servers": {"plain": servers.commands[0], "spec": servers.commands[1]},
            "request": body, "capture": "scripts/capture_engine_fixtures.py"}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
