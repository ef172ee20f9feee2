# The two commands of the README. Both set everything up first (idempotent, see scripts/setup.sh).
.PHONY: app test

app:
	bash scripts/setup.sh app
	.venv/bin/python app.py

# lint-imports: the layers' import contracts (pyproject.toml), then the whole suite, one worker per core
test:
	bash scripts/setup.sh test
	.venv/bin/lint-imports
	.venv/bin/python -m pytest -q -ra -n auto
