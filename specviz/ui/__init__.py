"""The Gradio app: renders the engine's event stream."""
