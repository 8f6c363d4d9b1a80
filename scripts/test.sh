#!/usr/bin/env bash
# The test suite: installs what it needs, runs on a fresh lab (real hosts with systemd + sshd),
# runs lint, types, the documentation's strict build and every test, and always takes the lab down
# again, also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

docs_site=$(mktemp -d)  # the documentation's strict build goes here (site/ is not kept)
cleanup() { rm -rf "$docs_site"; .venv/bin/python -m gpudeploy_lab down || true; }
trap cleanup EXIT

.venv/bin/ruff check src tasks.py tests bench docs
.venv/bin/mypy
# The documentation site, strictly: a broken link, a missing page or anchor fails the suite
# (docs/gen.py's generated parts are checked against the code by tests/docs). Not --quiet: mkdocs
# then no longer counts its warnings, and --strict passes a broken link.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$docs_site"
# A real engine for the lab's vllm tier: vLLM's CPU build + a tiny model, built once (~3 min) and
# cached under /var/cache/gpudeploy-lab/engines; lab hosts see it read-only.
.venv/bin/python -m gpudeploy_lab engine
# The lab tests bring up fresh hosts of this checkout themselves (tests/lab/conftest.py), replacing
# any lab left up, e.g. by the README's first command.
.venv/bin/pytest -ra "$@"
