"""The docs generator's parts, run by scripts/docs.py (which documents what it makes).

Data flows one way: the report readers (`reports`) and the code the reference pages describe (`cli_reference`,
`api_reference`, `architecture`, `code_values`) feed the renderer (`render`: Jinja, with `formats` and `about`);
`generated` gathers every generated file and says which committed ones differ.
"""
