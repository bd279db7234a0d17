# Shared by the gen-*.sh scripts (sourced, not run): installing pinned generators from PyPI.

# Runs a command as root: directly when root, through sudo otherwise.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "error: need root to run: $*" >&2
        return 1
    fi
}

# pip_venv_install VENV REQUIREMENT: a fresh venv at VENV with REQUIREMENT installed, installing
# python3 and its venv module from Debian's packages when they are missing.
pip_venv_install() {
    local venv="$1" requirement="$2"
    if ! command -v python3 >/dev/null; then
        as_root apt-get update -q
        as_root apt-get install -y -q python3
    fi
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    # Debian ships venv (and the pip it bootstraps) separately from python3.
    if ! python3 -m venv "$venv" >/dev/null 2>&1; then
        rm -rf "$venv"
        as_root apt-get update -q
        as_root apt-get install -y -q python3-venv
        python3 -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "$requirement"
}
