#!/usr/bin/env bash
# scripts/install-deps.sh — make sure the tools flashattn builds with are present.
#
# Idempotent and quick when everything is there. As root on Debian/Ubuntu it
# installs what is missing with apt-get; otherwise it says what to install.
# Python: if `python3` lacks nanobind/scikit-build-core/numpy/pytest, they go into
# a virtual environment at .venv/ (the Makefile and CI use it when it exists).
#
# Usage: scripts/install-deps.sh [--no-python]
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
want_python=1
[[ "${1:-}" == "--no-python" ]] && want_python=0

say() { echo "install-deps: $*" >&2; }

# --- system packages: (how to detect it, Debian package) -------------------------
missing=()
have_command() { command -v "$1" >/dev/null 2>&1; }
have_file() { [[ -e "$1" ]]; }
have_command cmake || missing+=(cmake)
have_command ninja || missing+=(ninja-build)
have_command g++ || missing+=(g++)
have_command make || missing+=(make)
have_file /usr/include/gtest/gtest.h || missing+=(libgtest-dev)
have_file /usr/include/CLI/CLI.hpp || missing+=(libcli11-dev)
if [[ $want_python == 1 ]]; then
  have_command python3 || missing+=(python3)
  if have_command python3; then
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
    python3 -c 'import os, sysconfig; exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
      >/dev/null 2>&1 || missing+=(python3-dev)
  else
    missing+=(python3-venv python3-dev)
  fi
fi

if ((${#missing[@]})); then
  if [[ $(id -u) == 0 ]] && have_command apt-get; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    say "missing: ${missing[*]}"
    say "install them, e.g.: sudo apt-get install -y ${missing[*]}"
    exit 1
  fi
fi

# cmake >= 3.25 (Debian 12 ships 3.25.1).
cmake_version="$(cmake --version | head -n1 | awk '{print $3}')"
if ! printf '3.25\n%s\n' "$cmake_version" | sort -V -C; then
  say "cmake $cmake_version is too old: flashattn needs >= 3.25 (pip install cmake, or a newer distribution)"
  exit 1
fi

# --- Python test dependencies -----------------------------------------------------
if [[ $want_python == 1 ]]; then
  python_modules='import nanobind, scikit_build_core, numpy, pytest'
  if python3 -c "$python_modules" >/dev/null 2>&1; then
    exit 0
  fi
  venv="$repo_root/.venv"
  if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "$python_modules" >/dev/null 2>&1; then
    say "creating $venv with nanobind, scikit-build-core, numpy, pytest"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet nanobind scikit-build-core numpy pytest
  fi
fi
