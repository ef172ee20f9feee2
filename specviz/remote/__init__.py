"""Remote engines: the engines people deploy (llama.cpp's llama-server, vLLM, SGLang) behind one small interface: connect to an
allowed OpenAI-compatible base URL, probe what its version offers, stream completions timed on the client, and
read its speculative statistics per request (or as a difference of its Prometheus counters); race an endpoint
that speculates against one that does not (`race.py`, `summary.py`); the command is `specviz.commands.engines`.

Data flows one way: policy -> transport -> adapters -> engine -> race -> summary -> report. Nothing here
imports the app (ui, api) or the bench; the cost model comes from `specviz.analysis`.
"""
