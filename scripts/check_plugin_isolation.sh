#!/usr/bin/env bash
# Each plugin distribution must install, import and pass its own tests with only
# the kernel beside it: a fresh venv per plugin, non-editable installs (wheels).
# Every distribution used is first built as an sdist and a wheel made from that sdist
# (scripts/build_dists.py, with .venv's hatchling), and `twine check --strict` passes on
# all of them: what would be uploaded to PyPI (docs/publishing.md).
# A plugin is exercised on the reference stack: models need a kernel set and
# executors need a model, so kernels/torch and models/llama are installed
# beside every plugin, and front-ends are compared against the reference
# front-end, frontends/openai; nothing else is, but for the kernel set a plugin
# extends (kernels/cpu-native is the cpu set and more).
#
# Usage: check_plugin_isolation.sh [--skipped-nodeids FILE] [plugins/KIND/NAME ...]
#   (default: every plugin). --skipped-nodeids appends the node ids of the plugin tests
#   that skipped here (e.g. for want of a sibling plugin), for a run with everything installed.
# LLMP_ISOLATION_JOBS plugins are checked at once (default 2): their installs link from uv's
# cache and their tests are mostly waiting on engine processes.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
export LLMP_OMP_SPIN=${LLMP_OMP_SPIN:-0}  # as ./dev test: one OpenMP thread per engine, not spinning
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export LLMP_STRICT_PLUGINS=1
# uv installs no bytecode: let each venv's first imports write it, once, rather than compile
# every module of torch into each venv up front
unset PYTHONDONTWRITEBYTECODE

skipped_out=
if [[ ${1:-} == --skipped-nodeids ]]; then
    skipped_out=$(realpath "$2")
    shift 2
fi
projects=("$@")
[[ ${#projects[@]} -gt 0 ]] || projects=(plugins/*/*/)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
venv_init

key() {  # PROJECT: a file name for it
    [[ $1 == . ]] && echo kernel || echo "${1//\//_}"
}

wheel() {  # PROJECT: the path of its wheel, built by build_dists
    echo "$work/dists/$(key "$1")"/*.whl
}

build_dists() {  # the kernel, the reference stack and the plugins asked for: each sdist and wheel once
    local project pairs=()
    for project in . plugins/kernels/torch plugins/kernels/cpu plugins/models/llama plugins/frontends/openai "$@"; do
        [[ -d $work/dists/$(key "$project") ]] && continue
        mkdir -p "$work/dists/$(key "$project")"
        pairs+=("$project" "$work/dists/$(key "$project")")
    done
    .venv/bin/python scripts/build_dists.py "${pairs[@]}"
}

check_dists() {  # twine check --strict on every sdist and wheel built, in one call; its report only on failure
    local report
    # wide and plain: one line a file, so that the failing ones and their warnings can be picked out
    if report=$(COLUMNS=250 .venv/bin/twine --no-color check --strict "$work"/dists/*/* 2>&1); then
        echo "ok: twine check --strict: $(ls "$work"/dists/*/* | wc -l) sdists and wheels"
    else
        grep -v ': PASSED *$' <<< "$report" | sed 's/ *$//'
        echo "FAIL: twine check --strict"
        return 1
    fi
}

check_one() {  # PROJECT: its venv, its entry points, its tests; the log goes to stdout
    local project=$1 venv=$work/venvs/$(key "$1") status=0 base entries entry module
    local wheels=("$(wheel .)[test]")
    local bases=(plugins/kernels/torch plugins/models/llama)
    [[ $project == plugins/frontends/* ]] && bases+=(plugins/frontends/openai)
    [[ $project == plugins/kernels/cpu-native ]] && bases+=(plugins/kernels/cpu)
    for base in "${bases[@]}"; do
        [[ $project == "$base" ]] || wheels+=("$(wheel "$base")")
    done
    wheels+=("$(wheel "$project")[test]")
    venv_create "$venv" && venv_install "$venv" -c constraints.txt "${wheels[@]}" \
        || { echo "FAIL: $project: install"; return 1; }
    entries=$("$venv/bin/python" - "$project/pyproject.toml" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
for name, ref in project["entry-points"]["llmp"].items():
    print(name, ref.split(":")[0])
PY
) && [[ -n $entries ]] || { echo "FAIL: $project: no llmp entry points in its pyproject.toml"; return 1; }
    while read -r entry module; do
        "$venv/bin/python" -c "import $module" || { echo "FAIL: $project: import $module"; status=1; }
        "$venv/bin/llmp" plugins list --json \
            | "$venv/bin/python" -c "import json,sys; rows={r['name']: r for r in json.load(sys.stdin)}; r=rows['$entry']; assert r['status']=='ok' and r['components'], r" \
            || { echo "FAIL: $project: $entry not listed as ok"; status=1; }
    done <<< "$entries"
    if [[ -d $project/tests ]]; then
        "$venv/bin/python" -m pytest -q -p no:cacheprovider -p scripts.pytest_skipped_nodeids \
            --skipped-nodeids="$work/skipped/$(key "$project")" "$project/tests" \
            || { echo "FAIL: $project: its tests fail in isolation"; status=1; }
    fi
    rm -rf "$venv"
    return $status
}

for i in "${!projects[@]}"; do
    projects[i]=${projects[i]%/}
    [[ -f ${projects[i]}/pyproject.toml ]] || unset 'projects[i]'
done
projects=("${projects[@]}")
mkdir -p "$work/logs" "$work/skipped"
[[ -x .venv/bin/twine ]] || { echo "FAIL: no .venv with hatchling and twine, to build and check distributions: run ./dev setup"; exit 1; }
build_dists "${projects[@]}"
status=0
check_dists || status=1

# a pool of LLMP_ISOLATION_JOBS checks; each one's log is shown whole when it ends
declare -A running=()  # pid -> project
failed=()
reap() {  # wait for one check to end, show its log
    local rc=0 pid
    wait -n -p pid "${!running[@]}" || rc=$?
    cat "$work/logs/$(key "${running[$pid]}")"
    [[ $rc -eq 0 ]] || failed+=("${running[$pid]}")
    unset 'running[$pid]'
}
for project in "${projects[@]}"; do
    while [[ ${#running[@]} -ge ${LLMP_ISOLATION_JOBS:-2} ]]; do reap; done
    (
        SECONDS=0
        echo "== $project: fresh venv"
        rc=0
        check_one "$project" || rc=$?
        echo "== $project: $([[ $rc -eq 0 ]] && echo ok || echo FAILED) in ${SECONDS}s"
        exit $rc
    ) > "$work/logs/$(key "$project")" 2>&1 &
    running[$!]=$project
done
while [[ ${#running[@]} -gt 0 ]]; do reap; done

if [[ -n $skipped_out ]]; then
    cat "$work/skipped"/* >> "$skipped_out" 2> /dev/null || true
fi
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "FAIL: ${#failed[@]} of ${#projects[@]} plugins: ${failed[*]}"
    status=1
fi
[[ $status -eq 0 ]] || exit 1
echo "ok: ${#projects[@]} plugins, each on its own"
