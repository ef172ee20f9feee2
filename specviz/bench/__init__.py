"""Benchmarks: aggregate speculative and AR event streams into measured speedups, and report them; measurement and
reports only (the commands that run them are `specviz.commands`)."""
