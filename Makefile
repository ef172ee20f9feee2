# The two commands of the README, and the docs site. Each sets up what it needs first (idempotent, scripts/setup.sh).
.PHONY: app test docs

app:
	bash scripts/setup.sh app
	.venv/bin/python app.py

# lint-imports: the layers' import contracts (pyproject.toml); the generated docs pages current and the site's links
# whole (quiet unless it fails); then the whole suite, one worker per core
test:
	bash scripts/setup.sh test
	.venv/bin/lint-imports
	.venv/bin/python scripts/docs.py --check
	@out=$$(NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict 2>&1) || { echo "$$out"; exit 1; }
	.venv/bin/python -m pytest -q -ra -n auto

# The docs site (mkdocs.yml, docs/): the pages made from code and reports written afresh (scripts/docs.py), then
# built offline into site/ with --strict (a broken link, a missing page or anchor fails)
docs:
	bash scripts/setup.sh docs
	.venv/bin/python scripts/docs.py
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict
