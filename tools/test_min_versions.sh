#!/usr/bin/env bash
# Run a subset of the tests against the LOWEST versions of the core dependencies that
# pyproject.toml allows (each ">=X" floor installed as "==X"), in a fresh venv.
#
#   tools/test_min_versions.sh [VENV_DIR] [pytest args...]
#
# A floor that is too low shows up here as an install conflict or a failing test: raise it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-${TMPDIR:-/tmp}/embstore-min-venv}
shift || true
REUSE=${REUSE:-0}  # REUSE=1: keep an existing venv (only re-run the tests)
PY=${PYTHON:-python3}

pins=$("$PY" - <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
out = []
for dep in deps:
    m = re.match(r"^([A-Za-z0-9_.\-\[\]]+)\s*>=\s*([0-9][^,;\s]*)", dep)
    if not m:
        raise SystemExit(f"no '>=' floor in dependency {dep!r}")
    out.append(f"{m.group(1)}=={m.group(2)}")
print(" ".join(out))
PY
)
echo "floors: $pins"
if [ "$REUSE" != 1 ] || [ ! -x "$VENV/bin/python" ]; then
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q $pins pytest hypothesis
fi
"$VENV/bin/pip" list 2>/dev/null | grep -i -E "^(numpy|zarr|numcodecs|crc32c|click|google-crc32c) "
if [ $# -eq 0 ]; then
    set -- tests/test_contract.py tests/test_store.py tests/test_integrity.py \
        tests/test_foreign.py tests/test_protocols.py tests/test_layer.py tests/test_batch_oov.py
fi
# zarr 3.1.0 warns that its vlen-utf8 codec (the keys array) is not in the v3 spec yet
PYTHONPATH=$PWD "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m "not slow" \
    -W "ignore::DeprecationWarning" -W "ignore:The codec \`vlen-utf8\`:UserWarning" "$@"
