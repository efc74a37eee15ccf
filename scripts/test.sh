#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine, then runs every test:
# Rust (cargo test), lint and types (ruff, mypy, clippy, rustfmt), Python (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: a C compiler (aws-lc, bundled SQLCipher), perl and make (SQLCipher's
# vendored OpenSSL is built from source: no libssl-dev), PostgreSQL and Redis for the
# server tests (the tests start their own instances; the services stay stopped).
SYSTEM_PACKAGES=(build-essential perl pkg-config postgresql redis-server)
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    missing=()
    for pkg in "${SYSTEM_PACKAGES[@]}"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
    fi
fi

VENV=${SVC_VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q -e ".[all,dev]"

# One build per run: incremental state would only add to the target dir's size.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

echo "== rust: format, lint, tests"
cargo fmt --all --check
cargo clippy --locked -q -p svc-native --features python,attacker --all-targets -- -D warnings
cargo clippy --locked -q -p svc-crypto-bench -p svc-identity-bench -- -D warnings
cargo test --locked -q -p svc-native

echo "== python: lint, format, types"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy"

echo "== readme: the first command, verbatim, from a fresh clone"
bash scripts/readme_first_command.sh

echo "== python: tests"
"$VENV/bin/python" -m pytest -q "$@"
