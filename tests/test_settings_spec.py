"""One spec per kind of setting, derived everywhere: every field appears with the same default and range
in the CLI's --help, in the API (view_api) and in the app's controls, and is validated with one sentence
naming it. Adding a setting means one field in one file: a new field shows up on every surface."""

from __future__ import annotations

import argparse
import inspect
import re
from typing import Literal

import gradio as gr
import pytest
from pydantic import Field
from pydantic.dataclasses import dataclass

from specviz.api.endpoints import endpoint
from specviz.cli import build_parser
from specviz.engine import DecodeConfig
from specviz.models import PairSpec
from specviz.runs.distribution import DistributionSettings
from specviz.settings.errors import InputError
from specviz.settings.limits import CLI_LIMITS, Limits
from specviz.settings.options import add_options, options_of, values_of
from specviz.settings.spec import fields_of, number_text, validate
from specviz.ui.controls import controls

LIMITS = Limits(max_k=8, max_new_tokens=300, max_samples=500)  # not the defaults (K: below its default): the surfaces
# must follow them, and offer the limit where the default is beyond it


def help_of(command: str) -> dict[str, str]:
    """`specviz COMMAND --help`, one line per option (a wide formatter): flag -> the rest of its line."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    sub.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100_000, max_help_position=100_000)
    lines = [line.strip() for line in sub.format_help().splitlines() if line.strip().startswith("--")]
    return {line.split()[0].rstrip(","): line for line in lines}


@pytest.mark.parametrize("command, limits", [("serve", Limits()), ("trace", CLI_LIMITS), ("bench", CLI_LIMITS)])
def test_every_setting_is_a_cli_option_with_its_default_and_range(command, limits):
    text = help_of(command)
    for spec in (DecodeConfig, PairSpec):
        for s, flag, _ in options_of(spec, limits):
            entry = text[flag]
            assert s.help in entry, (flag, entry)
            if s.kind is not bool:
                assert f"default: {s.default}" in entry, (flag, entry)
            if s.choices:
                assert "{" + ",".join(s.choices) + "}" in entry, flag
            elif s.kind in (int, float) and not s.must:
                assert f"{number_text(s.lo)}..{number_text(s.hi)}" in entry or f">= {number_text(s.lo)}" in entry, \
                    (flag, entry)
            elif s.must:
                assert s.must in entry, (flag, entry)
    if command == "serve":
        for s, flag, _ in options_of(Limits):
            assert f"default: {s.default}" in text[flag], flag


def test_cli_defaults_parse_to_the_spec_defaults():
    for command in ("serve", "trace --prompt x", "bench"):
        args = build_parser().parse_args(command.split())
        assert validate(DecodeConfig, values_of(args, DecodeConfig), CLI_LIMITS) == DecodeConfig()
        assert validate(PairSpec, values_of(args, PairSpec)) == PairSpec()


@pytest.fixture(scope="module")
def app(server_session):
    from specviz.server import build_server

    return build_server(server_session, LIMITS)


def component(demo: gr.Blocks, elem_id: str):
    found = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == elem_id]
    assert len(found) == 1, elem_id
    return found[0]


def test_every_decoding_setting_is_a_control_with_its_default_range_and_help(app):
    for spec, names, prefix in ((DecodeConfig, None, "sv-set-"), (DistributionSettings, None, "sv-dist-"),
                                (PairSpec, ("dtype",), "sv-set-")):
        for s in fields_of(spec, LIMITS):
            if names and s.name not in names:
                continue
            c = component(app, f"{prefix}{s.name}")
            assert c.label == s.label and c.info == s.help
            if s.choices:
                assert [v for v, _ in c.choices] == list(s.choices) and c.value == s.default
                continue
            assert c.value == s.default, s.name
            lo = s.lo + s.step if s.lo_open else s.lo
            assert (c.minimum, c.maximum) == (lo, s.hi), s.name
    assert component(app, "sv-set-k").maximum == LIMITS.max_k  # the server's limit, not the spec's


def api_params(client, name: str) -> dict:
    info = client.view_api(return_format="dict", print_info=False)["named_endpoints"][f"/{name}"]
    return info


@pytest.fixture(scope="module")
def api(serve, server_session):
    _, client = serve(server_session, LIMITS)
    return client


@pytest.mark.parametrize("name, specs, leading", [
    ("generate", [DecodeConfig], ["prompt"]),
    ("race", [DecodeConfig], ["prompt"]),
    ("same_distribution", [DistributionSettings, DecodeConfig], ["prompt"]),
])
def test_every_setting_is_an_api_parameter_with_its_default_and_range(api, name, specs, leading):
    info = api_params(api, name)
    params = {p["parameter_name"]: p for p in info["parameters"]}
    expected = []
    for spec in specs:
        for s in fields_of(spec, LIMITS):
            if s.name in expected:
                continue  # same_distribution: the experiment's temperature, not the decoding one
            if name == "same_distribution" and spec is DecodeConfig and s.name == "max_new_tokens":
                continue  # the experiment decodes two tokens
            expected.append(s.name)
            p = params[s.name]
            assert p["parameter_has_default"] and p["parameter_default"] == s.default, s.name
            if s.choices:
                assert p["type"]["enum"] == list(s.choices), s.name
            what = " | ".join(map(repr, s.choices)) if s.choices else f"{s.kind.__name__}, {s.must_text}"
            assert f"{s.name} ({what}; default {s.default!r}): {s.help}" in info["description"], s.name
    assert list(params) == leading + expected  # positional order: old scripts keep working
    assert f"between 1 and {LIMITS.max_k}" in info["description"]  # K's range is the server's limit


def test_load_pair_offers_the_dtypes_of_the_pair_spec(api):
    params = {p["parameter_name"]: p for p in api_params(api, "load_pair")["parameters"]}
    dtype = next(s for s in fields_of(PairSpec) if s.name == "dtype")
    assert params["dtype"]["type"]["enum"] == list(dtype.choices) and params["dtype"]["parameter_default"] == "auto"


BAD = {int: 2.5, float: "many", str: 42, bool: "yes"}


@pytest.mark.parametrize("spec", [DecodeConfig, PairSpec, Limits, DistributionSettings])
def test_a_bad_value_of_any_setting_is_one_sentence_naming_it(spec):
    for s in fields_of(spec, LIMITS):
        bad = "nonsense" if s.choices else BAD[s.kind]
        with pytest.raises(InputError) as err:
            validate(spec, {s.name: bad}, LIMITS)
        message = str(err.value)
        assert message.startswith(f"{s.label} must be") and message.endswith(".") and "\n" not in message, message
        if s.hi is not None and s.kind in (int, float):
            with pytest.raises(InputError, match=re.escape(s.label)):
                validate(spec, {s.name: s.hi + 1}, LIMITS)
    with pytest.raises(InputError, match="is not a setting"):
        validate(spec, {"no_such_setting": 1}, LIMITS)


def test_a_new_field_appears_on_every_surface():
    """The promise of the spec, on a spec made here: one field, and the CLI, the validation, the controls
    and the API all have it."""
    @dataclass(frozen=True)
    class Toy:
        k: int = Field(3, ge=1, title="K", description="drafts", json_schema_extra={"limit": "max_k"})
        mode: Literal["a", "b"] = Field("a", title="mode", description="the mode")
        warmth: float = Field(0.5, ge=0, le=1, title="warmth", description="how warm",
                              json_schema_extra={"step": 0.1})

    parser = argparse.ArgumentParser()
    add_options(parser, Toy, LIMITS)
    args = parser.parse_args(["--warmth", "0.25"])
    assert validate(Toy, values_of(args, Toy), LIMITS) == Toy(warmth=0.25)
    assert "how warm (0..1; default: 0.5)" in " ".join(parser.format_help().split())
    with pytest.raises(InputError, match=r"warmth must be between 0 and 1, got 2"):
        validate(Toy, {"warmth": 2}, LIMITS)
    with gr.Blocks():
        made = controls(Toy, LIMITS)
    assert isinstance(made["warmth"], gr.Slider) and (made["warmth"].minimum, made["warmth"].maximum) == (0, 1)
    assert isinstance(made["mode"], gr.Radio) and made["k"].maximum == LIMITS.max_k
    fn = endpoint(lambda values: values, "toy", "A toy.", [], fields_of(Toy, LIMITS), returns=dict)
    assert list(inspect.signature(fn).parameters) == ["k", "mode", "warmth"] and fn(2) == {"k": 2, "mode": "a",
                                                                                       "warmth": 0.5}
    assert "warmth (float, between 0 and 1; default 0.5): how warm" in fn.__doc__
