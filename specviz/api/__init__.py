"""The JSON API: named endpoints for scripts (gradio_client), thin adapters over `specviz.runs`."""
