#!/usr/bin/env bash
# Build the documentation site (mkdocs.yml) strictly into site/, or serve it to read locally.
#
#   bash scripts/docs/build.sh                 # mkdocs build --strict: site/ (a few seconds)
#   bash scripts/docs/build.sh --serve         # http://127.0.0.1:8000, rebuilt on each change
#   bash scripts/docs/build.sh --serve -a 127.0.0.1:8001   # further options go to mkdocs serve
#
# In strict mode every warning fails the build: a link to a missing page, file or anchor, or a
# page that the nav leaves out (scripts/docs/hooks.py says how links and the nav are read).
# The theme and the search index come with the dev extra; nothing is fetched while building.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"

if ! "$PY" -c 'import material, mkdocs' 2>/dev/null; then
    printf '[docs] ERROR: mkdocs or mkdocs-material is not installed in .venv; install the dev extra:\n' >&2
    printf "[docs]   .venv/bin/pip install -c constraints.txt -e '.[dev]'\n" >&2
    exit 1
fi
# Material prints a banner about MkDocs 2.0 on every run; this build pins MkDocs 1.x.
export NO_MKDOCS_2_WARNING=1

if [[ "${1:-}" == "--serve" ]]; then
    shift
    exec "$PY" -m mkdocs serve "$@"
fi
exec "$PY" -m mkdocs build --strict --site-dir site "$@"
