# The two commands of the README. Both set everything up first (idempotent, see scripts/setup.sh).
.PHONY: app test

app:
	bash scripts/setup.sh app
	.venv/bin/python app.py

test:
	bash scripts/setup.sh test
	.venv/bin/python -m pytest -q -ra
