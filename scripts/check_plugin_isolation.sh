#!/usr/bin/env bash
# Each plugin distribution must install, import and pass its own tests with only
# the kernel beside it: a fresh venv per plugin, non-editable installs (wheels).
# A plugin is exercised on the reference stack: models need a kernel set and
# executors need a model, so kernels/torch and models/llama are installed
# beside every plugin, and front-ends are compared against the reference
# front-end, frontends/openai; nothing else is.
# Usage: check_plugin_isolation.sh [plugins/KIND/NAME ...]   (default: every plugin)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export LLMP_OMP_SPIN=${LLMP_OMP_SPIN:-0}  # as ./dev test: no spinning OpenMP threads in test runs
status=0
projects=("$@")
[[ ${#projects[@]} -gt 0 ]] || projects=(plugins/*/*/)
for project in "${projects[@]}"; do
    project=${project%/}
    [[ -f $project/pyproject.toml ]] || continue
    venv=$(mktemp -d)/venv
    echo "== $project: fresh venv"
    "$PYTHON" -m venv "$venv"
    reference=()
    bases=(plugins/kernels/torch plugins/models/llama)
    [[ $project == plugins/frontends/* ]] && bases+=(plugins/frontends/openai)
    for base in "${bases[@]}"; do
        [[ $project == "$base" ]] || reference+=("./$base")
    done
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c constraints.txt \
        ".[test]" "${reference[@]}" "./$project[test]"
    names=$("$venv/bin/python" - "$project/pyproject.toml" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
for name, ref in project["entry-points"]["llmp"].items():
    print(name, ref.split(":")[0])
PY
)
    while read -r entry module; do
        "$venv/bin/python" -c "import $module" || { echo "FAIL: $project: import $module"; status=1; }
        LLMP_STRICT_PLUGINS=1 "$venv/bin/llmp" plugins list --json \
            | "$venv/bin/python" -c "import json,sys; rows={r['name']: r for r in json.load(sys.stdin)}; r=rows['$entry']; assert r['status']=='ok' and r['components'], r" \
            || { echo "FAIL: $project: $entry not listed as ok"; status=1; }
    done <<< "$names"
    if [[ -d $project/tests ]]; then
        LLMP_STRICT_PLUGINS=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider "$project/tests" \
            || { echo "FAIL: $project: its tests fail in isolation"; status=1; }
    fi
    rm -rf "$(dirname "$venv")"
done
exit $status
