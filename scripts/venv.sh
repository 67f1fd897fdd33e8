# Sourced by ./dev and scripts/check_plugin_isolation.sh: make venvs and install into them.
#
# uv does the work when it can be had: it is taken from PATH, or bootstrapped once with pip
# into a small tools venv; its cache (uv's default place) is shared by every venv on the
# machine, so a second venv links what the first downloaded and built. When uv cannot be
# had, pip does the same work, slower. uv is given pip's configured sources (index, extra
# indexes, find-links, constraints, CA bundle), so both resolve alike on a machine whose pip
# is set up with local wheels (e.g. the CPU build of torch).
#
#   venv_init                  choose the installer (once; call before the others)
#   venv_create DIR            a venv at DIR (with pip in it: tests pip-install fixtures)
#   venv_install DIR ARGS...   install ARGS (pip install syntax) into the venv at DIR

PYTHON=${PYTHON:-python3}
LLMP_TOOLS=${LLMP_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/llmp-dev-tools}
VENV_UV=         # the uv executable, empty when pip does the work
VENV_UV_SOURCES=() # pip's configured sources, as uv arguments
VENV_UV_CONSTRAINTS=()

venv_init() {
    [[ -n ${VENV_INITIALISED:-} ]] && return
    VENV_INITIALISED=1
    if [[ ${LLMP_INSTALLER:-uv} == pip ]]; then
        return
    elif command -v uv > /dev/null; then
        VENV_UV=$(command -v uv)
    elif [[ -x $LLMP_TOOLS/bin/uv ]] \
        || { "$PYTHON" -m venv "$LLMP_TOOLS" && "$LLMP_TOOLS/bin/python" -m pip install --quiet uv; }; then
        VENV_UV=$LLMP_TOOLS/bin/uv
    else
        echo "venv.sh: uv cannot be had; installing with pip" >&2
        return
    fi
    local kind value
    while read -r kind value; do
        case $kind in
            constraint) VENV_UV_CONSTRAINTS+=(--constraint "$value") ;;
            cert) [[ -n ${SSL_CERT_FILE:-} ]] || export SSL_CERT_FILE=$value ;;
            *) VENV_UV_SOURCES+=("--$kind" "$value") ;;
        esac
    done < <(venv_pip_sources)
    # pip takes the best match over all its indexes; uv by default stops at the first index
    # that has the name
    VENV_UV_SOURCES+=(--index-strategy unsafe-best-match)
}

venv_pip_sources() {  # "KIND VALUE" lines from pip's configuration (files and PIP_* variables)
    "$PYTHON" -m pip config list 2> /dev/null | "$PYTHON" -c '
import ast, sys
seen = set()
for line in sys.stdin:
    key, _, value = line.strip().partition("=")
    kind = key.rsplit(".", 1)[-1]
    if kind not in {"index-url", "extra-index-url", "find-links", "constraint", "cert"}:
        continue
    for item in ast.literal_eval(value).split():
        if (kind, item) not in seen:
            seen.add((kind, item))
            print(kind, item)
'
}

venv_create() {
    if [[ -n $VENV_UV ]]; then
        "$VENV_UV" venv --quiet --seed --python "$("$PYTHON" -c 'import sys; print(sys.executable)')" "$1"
    else
        "$PYTHON" -m venv "$1"
        "$1/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    fi
}

venv_install() {
    local venv=$1
    shift
    if [[ -n $VENV_UV ]]; then
        "$VENV_UV" pip install --quiet --python "$venv/bin/python" \
            "${VENV_UV_SOURCES[@]}" "${VENV_UV_CONSTRAINTS[@]}" "$@"
    else
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
    fi
}
