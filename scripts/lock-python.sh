#!/usr/bin/env bash
# Regenerates scripts/requirements.lock from scripts/requirements.txt (and, for ./.venv-aider,
# scripts/requirements-aider.lock from scripts/requirements-aider.txt): every Python package the
# tests install (the direct ones and all they depend on), pinned, each with the SHA-256 of its
# files, so scripts/setup.sh installs with `pip install --require-hashes` and a changed or
# substituted file fails the install. To add a package: add it to requirements.txt with `==`,
# run this script, commit both files.
#
# Uses uv's resolver (from PyPI, in a throwaway virtualenv) for Linux x86_64, CPython 3.11.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
python3 -m venv "$TMP/venv"
"$TMP/venv/bin/pip" install --disable-pip-version-check -q "uv==0.9.30"
# requirements-aider.txt is locked on its own: aider goes into its own venv (.venv-aider).
for name in requirements requirements-aider; do
    "$TMP/venv/bin/uv" pip compile "$ROOT/scripts/$name.txt" \
        --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_31 \
        --no-header --quiet --output-file "$ROOT/scripts/$name.lock"
    printf '%s\n' "wrote scripts/$name.lock" >&2
done
