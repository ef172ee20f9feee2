"""Every named endpoint answers hostile input in time, with a result or one sentence naming the field, and nothing of
it reaches the server's log as a traceback: a seeded, property-based fuzz (hypothesis) of every field of every
endpoint the app publishes, through the real HTTP API (gradio_client) on the app serving the tiny pair on loopback.

One field is hostile at a time, the others valid: each field gets an integer past 64 bits and None, then values drawn
from a seeded strategy (the curated list of hostile inputs, or JSON of any shape: huge integers, long text, nesting,
a shipped trace with one part spoiled). Too few and too many values are sent as a script without gradio_client would
(`/gradio_api/call/<name>`). Its control: an endpoint that lets Python's own error through, or answers with a number
JSON cannot carry, is caught by the same checker.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest
from gradio_client.exceptions import AppError
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from specviz.analysis.whatif import WhatIfInputs
from specviz.api import endpoints
from specviz.bench.loadtest import one_sentence
from specviz.engine import DecodeConfig
from specviz.models import PairSpec
from specviz.models.pair import DTYPES
from specviz.models.tiny import tiny_pair
from specviz.runs.distribution import DistributionSettings
from specviz.serving.session import Session
from specviz.settings.limits import Limits
from specviz.settings.spec import fields_of

SEED = 77  # the number: the same calls every run
DRAWN = 4  # values drawn per field, after the two every field gets
CALL_SECONDS = 15  # one call's bound: a refusal takes milliseconds, an accepted run of the tiny pair well under this
LIMITS = Limits(max_new_tokens=8, max_k=8, max_samples=32, max_prompt_chars=2000, max_seconds=10)
SHIPPED = "trace_embedded_code.json"
TRACE = json.loads((Path(__file__).resolve().parents[1] / "specviz" / "data" / "traces" / SHIPPED).read_text())

# a valid value for each parameter a request must give, and where a default would make the tiny pair refuse the
# request for another field's sake (the 'self' drafter's exit layer must lie below the tiny target's layers)
VALID = {"prompt": "the man said that it was", "trace": SHIPPED, "draft": "tiny", "target": "tiny", "exit_layer": 1,
         "samples": 16}
# every field's name as its refusals say it: the spec's label, or the words of the run paths' own checks
LABELS = {s.name: s.label for spec in (DecodeConfig, DistributionSettings, WhatIfInputs, PairSpec)
          for s in fields_of(spec)}
WORDS = {"prompt": ("prompt",), "trace": ("trace",), "draft": ("draft", "model pair"),
         "target": ("target", "model pair")}
# Python's or the HTTP layer's own words: never in an answer
NOT_OURS = re.compile(r"Traceback|not supported between|object has no attribute|NoneType|keyword argument|"
                      r"positional argument|invalid literal|Exceeds the limit|exceeds 64-bit|validation error|"
                      r"event handler|Errno|could not convert|unhashable|not subscriptable|object is not|codec can't|"
                      r"Expecting value|gradio\.|pydantic|<[a-z_.]+ object at", re.I)
LOG_PROBLEMS = ("Traceback", "Exception in ASGI application", "ERROR")

BIG = 2**70  # past 64 bits: orjson (Gradio's encoder) cannot write it back
CURATED = [
    None, True, False, 0, -1, 1.5, 2**63, -(2**63) - 1, 2**64, 10**30, 1e308, -1e308, 5e-324,
    "NaN", "nan", "inf", "-Infinity", "1e9999", "0x10", "", " ", "\x00", "\x00" * 50, "\u202e\u2066evil\u2069",
    "😀" * 5000, "x" * 300_000, "<script>alert(1)</script>", "'; DROP TABLE runs; --",
    "../../../../etc/passwd", "/etc/passwd", "~/.ssh/id_rsa", "http://169.254.169.254/latest/meta-data/",
    "file:///etc/passwd", "{{7*7}}", "%s%s%n", [], {}, [1, 2, 3], ["the", "man"], {"a": 1}, [[[[[]]]]],
    {"path": "/etc/passwd"}, {"__class__": "x"}, '{"format": ',
    '{"format": "specviz-trace", "version": 99}', '{"a": ' * 5000, "9" * 5000, "embedded", "synthetic:qwen2.5-7b",
]
SERVER_FILE = {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}  # (gradio_client would upload its own)
# the places of a trace a spoiled copy spoils
SPOILED = [("meta", "config", "k"), ("meta", "config", "sampling", "temperature"), ("meta", "config", "seed"),
           ("meta", "config"), ("meta", "prompt"), ("meta", "prompt_tokens"), ("meta",), ("rounds",),
           ("rounds", 0, "k"), ("rounds", 0, "drafted"), ("rounds", 0, "emitted"), ("rounds", 0, "text"),
           ("rounds", 0, "draft_time"), ("ar_steps",), ("ar_steps", 0, "token"), ("ar_steps", 0, "time"),
           ("version",)]


def spoiled(path: tuple, value) -> str:
    data = json.loads(json.dumps(TRACE))
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return json.dumps(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63 - 2, max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)
leaves = st.sampled_from([v for v in CURATED if not isinstance(v, str) or len(v) < 100]) | json_values
HOSTILE = st.sampled_from(CURATED) | json_values | st.builds(spoiled, st.sampled_from(SPOILED), leaves)


def hostile(field: str):
    """Values for `field`; a pair load's dtype never one that would load the tiny pair again (a real load, seconds
    each, that is not what this test is about: its loading is test_hardening's)."""
    if field == "dtype":
        return HOSTILE.filter(lambda v: not (isinstance(v, str) and v in DTYPES))
    return HOSTILE


@dataclass(frozen=True)
class Answer:
    """What one call came to: a result, a refusal's message, or neither (it hung, or the client broke off)."""

    endpoint: str
    field: str
    value: object
    kind: str  # "result", "refused", "hung" or "broken"
    message: str = ""
    log: str = ""  # what the server wrote to its log meanwhile


def shown(value) -> str:
    text = repr(value)
    return text if len(text) < 80 else text[:77] + "..."


def problem(a: Answer) -> str | None:
    """Why an answer breaks the contract, None if it keeps it: in time, a result or one sentence of ours naming the
    field, and nothing in the server's log."""
    where = f"{a.endpoint} {a.field}={shown(a.value)}"
    if a.kind in ("hung", "broken"):
        return f"{where}: {a.kind} {a.message[:200]!r}"
    if any(p in a.log for p in LOG_PROBLEMS):
        return f"{where}: the server logged {a.log.strip()[-300:]!r}"
    if a.kind == "result":
        return None
    m = a.message
    if not one_sentence(m) or len(m) > 400:
        return f"{where}: not one sentence: {m[:300]!r}"
    if NOT_OURS.search(m):
        return f"{where}: Python's or the HTTP layer's words: {m[:300]!r}"
    names = (LABELS.get(a.field, a.field), a.field.replace("_", " "), *WORDS.get(a.field, ()))
    if a.field != "*" and not any(n.lower() in m.lower() for n in names):
        return f"{where}: does not name {names[0]!r}: {m[:300]!r}"
    return None


class ServerLog(logging.Handler):
    """What the server logs, read as it goes: its loggers' records (uvicorn's and Gradio's handlers write to the stream
    they were given at start, which a test's capture does not see) and what is printed to stderr (Gradio prints a
    handler's traceback there)."""

    LOGGERS = ("", "uvicorn", "uvicorn.error", "gradio", "specviz")

    def __init__(self, capfd):
        super().__init__(logging.WARNING)
        self.capfd, self.records = capfd, []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(self.format(record))  # (with its traceback, where it has one)

    def __enter__(self):
        for name in self.LOGGERS:
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc):
        for name in self.LOGGERS:
            logging.getLogger(name).removeHandler(self)

    def read(self) -> str:
        said, self.records = self.records, []
        return "\n".join([*said, self.capfd.readouterr().err])


class Caller:
    """Calls through gradio_client (one field hostile) and over plain HTTP (the count of values), each answer read
    with what the server logged meanwhile."""

    def __init__(self, client, url: str, server_log: ServerLog):
        self.client, self.url, self.server_log = client, url.rstrip("/"), server_log
        api = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
        self.endpoints = {name: [p["parameter_name"] for p in e["parameters"]] for name, e in api.items()}
        self.defaults = {name: {p["parameter_name"]: p["parameter_default"] for p in e["parameters"]
                                if p["parameter_has_default"]} for name, e in api.items()}
        self.answers: list[Answer] = []

    def valid(self, endpoint: str) -> dict:
        return {p: VALID.get(p, self.defaults[endpoint].get(p)) for p in self.endpoints[endpoint]}

    def log(self) -> str:
        return self.server_log.read()

    def call(self, endpoint: str, field: str, value) -> Answer:
        job = self.client.submit(**{**self.valid(endpoint), field: value}, api_name=endpoint)
        try:
            job.result(timeout=CALL_SECONDS)
            kind, message = "result", ""
        except AppError as e:
            kind, message = "refused", str(e)
        except TimeoutError:
            job.cancel()
            kind, message = "hung", f"no answer in {CALL_SECONDS} s"
        except Exception as e:  # noqa: BLE001 - the client broke off: what it says is the finding
            kind, message = "broken", f"{type(e).__name__}: {e}"
        return self.keep(Answer(endpoint, field, value, kind, message, self.log()))

    def call_raw(self, endpoint: str, values: list, field: str = "*") -> Answer:
        """`values` posted as they are, as curl would; the answer read from its event stream."""
        with httpx.Client(timeout=CALL_SECONDS) as http:
            try:
                posted = http.post(f"{self.url}/gradio_api/call{endpoint}", content=json.dumps({"data": values}),
                                   headers={"content-type": "application/json"})  # (ASCII: a surrogate escaped)
                events = http.get(f"{self.url}/gradio_api/call{endpoint}/{posted.json()['event_id']}").text
            except (httpx.HTTPError, KeyError, ValueError) as e:
                return self.keep(Answer(endpoint, field, values, "broken", f"{type(e).__name__}: {e}", self.log()))
        kind, message = "broken", events[-300:]
        for name, data in re.findall(r"event: (\w+)\ndata: (.*)", events):
            if name == "complete":
                kind, message = "result", ""
            elif name == "error":
                said = json.loads(data)
                kind, message = "refused", said.get("error", "") if isinstance(said, dict) else str(said or "")
        return self.keep(Answer(endpoint, field, values, kind, message, self.log()))

    def keep(self, answer: Answer) -> Answer:
        self.answers.append(answer)
        return answer


@pytest.fixture(scope="module")
def fuzzed(serve):
    """The app on the tiny pair, as an operator who lets visitors switch among the presets serves it (so /load_pair
    is published too): no visitor's value loads anything but a preset, and a dtype is never fuzzed into a load."""
    session = Session(tiny_pair(), PairSpec("tiny", "tiny", draft_quant="none", step="eager"), allow_switch=True,
                      allow_any_model=False)
    demo, client = serve(session, LIMITS)
    return client, demo.local_url


@pytest.fixture
def server_log(capfd):
    with ServerLog(capfd) as log:
        yield log


def fuzz(caller: Caller, rounds: int) -> None:
    """Every field of every named endpoint, one at a time: an integer past 64 bits and None, then `rounds` values
    drawn (seeded); then each endpoint with too few and too many values."""
    fields = [(e, f) for e, params in caller.endpoints.items() for f in params]
    for endpoint, field in fields:
        for value in (BIG, None):
            caller.call(endpoint, field, value)

    @seed(SEED)
    @settings(max_examples=rounds, database=None, deadline=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def drawn(data):
        for endpoint, field in fields:
            caller.call(endpoint, field, data.draw(hostile(field), label=f"{endpoint} {field}"))

    drawn()
    for endpoint, params in caller.endpoints.items():
        valid = list(caller.valid(endpoint).values())
        for values in (valid[:-1], [*valid, 1, "two"]) if params else ([1],):
            caller.call_raw(endpoint, values)
        if params:  # a file on the server's disk, asked for as Gradio's clients name an upload; a lone surrogate
            caller.call_raw(endpoint, [SERVER_FILE, *valid[1:]], params[0])  # (JSON carries it; gradio_client cannot)
            caller.call_raw(endpoint, ["\ud800" * 3, *valid[1:]], params[0])


def normal_text(client) -> str:
    return client.predict(VALID["prompt"], 4, 8, api_name="/generate")["text"]


@pytest.mark.timeout(240)  # the bound on the whole fuzz, far above what it takes (its summary line says)
def test_every_field_of_every_endpoint_answers_hostile_input_in_one_sentence(fuzzed, server_log):
    client, url = fuzzed
    before = normal_text(client)
    caller = Caller(client, url, server_log)
    assert set(caller.endpoints) >= {"/generate", "/race", "/same_distribution", "/whatif", "/replay", "/share_html",
                                     "/load_pair", "/info"}
    start = time.monotonic()
    fuzz(caller, DRAWN)
    seconds = time.monotonic() - start
    time.sleep(0.5)  # anything the server logs a moment after its last answer
    late = caller.log()
    problems = [p for p in map(problem, caller.answers) if p]
    problems += [f"the server logged after the last answer: {late.strip()[-300:]!r}"] * any(
        p in late for p in LOG_PROBLEMS)
    kinds = {k: sum(a.kind == k for a in caller.answers) for k in ("result", "refused", "hung", "broken")}
    print(f"{len(caller.answers)} hostile calls in {seconds:.1f} s: {kinds}")
    assert not problems, f"{len(problems)} of {len(caller.answers)} calls broke the contract:\n" + "\n".join(
        problems[:40])
    assert len(caller.answers) >= 300
    assert {(a.endpoint, a.field) for a in caller.answers} >= {(e, f) for e, ps in caller.endpoints.items() for f in ps}
    assert kinds["refused"] > kinds["result"]  # hostile, mostly: the fuzz is not a run of valid requests
    assert normal_text(client) == before  # the server still serves, the same pair, the same text


def test_the_checker_catches_an_endpoint_that_lets_a_raw_error_through(fuzzed, server_log, monkeypatch):
    """The control: /whatif planted to fail in Python's words (as it did, comparing a str with an int), then to
    answer with a number past 64 bits (as /generate echoed a top-k): the same checker says what is wrong, from what
    the caller was told and, apart, from what the server logged."""
    client, url = fuzzed
    caller = Caller(client, url, server_log)

    def compared(*args, **kwargs):
        return 4 <= "4"  # TypeError: '<=' not supported between instances of 'int' and 'str'

    monkeypatch.setattr(endpoints, "what_if", compared)
    raw = caller.call("/whatif", "k", "4")
    assert raw.kind == "refused" and "not supported between" in raw.message and "Traceback" in raw.log, raw
    assert "the server logged" in problem(raw)
    assert "not supported between" in (problem(replace(raw, log="")) or "")  # what the caller was told, alone

    monkeypatch.setattr(endpoints, "what_if", lambda *args, **kwargs: None)
    monkeypatch.setattr(endpoints, "asdict", lambda w: {"k": BIG})
    big = caller.call("/whatif", "k", 4)
    assert big.kind in ("broken", "hung") and problem(big), big  # what the caller got: no answer
    assert "exceeds 64-bit range" in big.log and "the server logged" in problem(replace(big, kind="result"))

    monkeypatch.undo()
    time.sleep(0.5)
    caller.log()
    assert problem(caller.call("/whatif", "k", 4)) is None  # unplanted, the same call keeps the contract
