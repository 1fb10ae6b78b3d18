#!/usr/bin/env bash
# Install embodied_rl into ./.venv (repo root): system rendering libraries, CPU-or-CUDA torch
# pinned to one version, then the package in editable mode with the chosen extras.
#
#   bash scripts/install.sh                          # extras: dev,libero,wandb,mlflow
#   EMBODIED_RL_EXTRAS=dev bash scripts/install.sh   # without LIBERO (saves ~1.6 GB) and
#                                                    # the trackers (~160 MB)
#   EMBODIED_RL_SKIP_APT=1 bash scripts/install.sh   # do not touch system packages
#
# Safe to re-run: every phase checks first, and the pip phases are skipped in well under a
# second when .venv already holds this pyproject.toml with these extras (stamp file).
set -euo pipefail

TORCH_VERSION="2.13.0"
APT_PACKAGES=(libegl1 libegl-mesa0 libgbm1 libgl1-mesa-dri libosmesa6)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"

say() { printf '[install] %s\n' "$*"; }
warn() { printf '[install] WARNING: %s\n' "$*" >&2; }
die() {
    printf '[install] ERROR: %s\n' "$*" >&2
    exit 1
}

# --- extras -----------------------------------------------------------------------------
EXTRAS="${EMBODIED_RL_EXTRAS-dev,libero,wandb,mlflow}"
EXTRAS="${EXTRAS// /}"
case ",$EXTRAS," in
*,vllm,*)
    die "the 'vllm' extra pins its own torch and CUDA packages, which conflict with" \
        "torch==$TORCH_VERSION; install vllm in a separate environment (scripts/install_vllm.sh)"
    ;;
esac
if [[ -n "$EXTRAS" ]]; then
    TARGET=".[$EXTRAS]"
else
    TARGET="."
fi

# --- system packages for headless MuJoCo rendering ---------------------------------------
install_apt_packages() {
    if [[ "${EMBODIED_RL_SKIP_APT:-0}" == "1" ]]; then
        say "apt: skipped (EMBODIED_RL_SKIP_APT=1)"
        return 0
    fi
    if ! command -v dpkg >/dev/null 2>&1; then
        warn "no dpkg (not Debian/Ubuntu): install EGL/Mesa/OSMesa libraries yourself for" \
            "MuJoCo rendering (${APT_PACKAGES[*]}); CPU LLM runs do not need them"
        return 0
    fi
    local missing=() pkg
    for pkg in "${APT_PACKAGES[@]}"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        say "apt: rendering packages present"
        return 0
    fi
    local sudo_cmd=()
    if [[ "$(id -u)" -ne 0 ]]; then
        if command -v sudo >/dev/null 2>&1 && { sudo -n true 2>/dev/null || [[ -t 0 ]]; }; then
            sudo_cmd=(sudo)
        else
            warn "missing system packages for MuJoCo rendering: ${missing[*]}; not root and" \
                "no usable sudo, so not installing them (CPU LLM runs do not need them)." \
                "Install with: apt-get install --no-install-recommends ${missing[*]}"
            return 0
        fi
    fi
    say "apt: installing ${missing[*]}"
    if ! { "${sudo_cmd[@]}" apt-get update -qq &&
        "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends "${missing[@]}" >/dev/null; }; then
        warn "apt-get failed; MuJoCo rendering may not work until these are installed:" \
            "${missing[*]} (CPU LLM runs do not need them)"
    fi
}
install_apt_packages

# --- python and the virtual environment ------------------------------------------------
command -v python3 >/dev/null 2>&1 || die "python3 not found; install Python >= 3.10"
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    die "Python >= 3.10 is required; python3 is $(python3 -c 'import sys; print(sys.version.split()[0])')"
fi

if [[ ! -x "$PY" ]]; then
    say "venv: creating $VENV with $(python3 -c 'import sys; print("Python", sys.version.split()[0])')"
    python3 -m venv "$VENV" ||
        die "'python3 -m venv' failed; on Debian/Ubuntu install the python3-venv package"
else
    say "venv: using existing $VENV"
fi
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
    die "$VENV uses Python < 3.10; remove it and re-run"

# torch is pinned for every pip call: without it timm and friends pull a newer torch plus
# several GB of CUDA packages.
printf 'torch==%s\n' "$TORCH_VERSION" >"$ROOT/constraints.txt"

STAMP_KEY="$(python3 - "$ROOT/pyproject.toml" "$ROOT/constraints.txt" "$EXTRAS" <<'EOF'
import hashlib
import sys

h = hashlib.sha256()
for path in sys.argv[1:3]:
    with open(path, "rb") as f:
        h.update(f.read())
h.update(sys.argv[3].encode())
print(h.hexdigest()[:16])
EOF
)"
STAMP="$VENV/.installed-$STAMP_KEY"

# The stamp alone is not trusted: the two distributions it vouches for must still be there.
installed_ok() {
    [[ -f "$STAMP" ]] && "$PY" - "$TORCH_VERSION" <<'EOF'
import sys
from importlib import metadata

try:
    torch_version = metadata.version("torch")
    metadata.version("embodied-rl")
except metadata.PackageNotFoundError:
    sys.exit(1)
sys.exit(torch_version.split("+")[0] != sys.argv[1])
EOF
}

if installed_ok; then
    say "pip: up to date (extras: ${EXTRAS:-none}); nothing to do"
else
    # Check the extras exist, because pip only warns about unknown ones.
    if [[ -n "$EXTRAS" ]]; then
        "$PY" - "$ROOT/pyproject.toml" "$EXTRAS" <<'EOF' || exit 1
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip will at least warn
    sys.exit(0)
with open(sys.argv[1], "rb") as f:
    known = set(tomllib.load(f)["project"].get("optional-dependencies", {}))
unknown = [e for e in sys.argv[2].split(",") if e and e not in known]
if unknown:
    print(f"[install] ERROR: unknown extra(s) {', '.join(unknown)}; "
          f"pyproject.toml defines: {', '.join(sorted(known))}", file=sys.stderr)
    sys.exit(1)
EOF
    fi

    current_torch="$("$PY" -c 'from importlib import metadata as m
try:
    print(m.version("torch"))
except m.PackageNotFoundError:
    print("")')"
    if [[ "${current_torch%%+*}" == "$TORCH_VERSION" ]]; then
        say "pip: torch $current_torch already installed"
    else
        say "pip: installing torch==$TORCH_VERSION"
        "$PY" -m pip install -q "torch==$TORCH_VERSION"
    fi

    say "pip: installing embodied-rl (editable) with extras: ${EXTRAS:-none}"
    "$PY" -m pip install -q -c "$ROOT/constraints.txt" -e "$TARGET"

    rm -f "$VENV"/.installed-*
    touch "$STAMP"
    say "pip: done ($("$PY" -c 'from importlib import metadata as m; print("torch", m.version("torch"))'))"
fi

say "ready. Activate with:  source $VENV/bin/activate"
say "run the tests with:    .venv/bin/python -m pytest"
say "later pip installs:    pip install -c constraints.txt <package>"
