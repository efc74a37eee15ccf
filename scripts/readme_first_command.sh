#!/usr/bin/env bash
# Runs the README's first command exactly as written from the root of a fresh clone of
# HEAD (committed work only), the way a new user does: a plain, non-editable install,
# then `svc demo`. Fails unless it exits 0.
#
# The command is read from the README (the first line of its first ```sh block), so this
# follows the README when the README changes. CARGO_TARGET_DIR points the build at this
# checkout's target/ only as a cache of compiled dependencies; the clone's own sources
# are what gets built and installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

command=$(awk '/^```sh$/ { getline; print; exit }' "$root/README.md")
if [ -z "$command" ]; then
    echo "README.md has no \`\`\`sh block to take the first command from" >&2
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$root" "$work/svc"
cd "$work/svc"
echo "\$ $command"
start=$SECONDS
if ! CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" \
    PIP_DISABLE_PIP_VERSION_CHECK=1 timeout 1800 bash -c "$command" >"$work/out.log" 2>&1; then
    tail -n 60 "$work/out.log" >&2
    echo "the README's first command failed from a fresh clone" >&2
    exit 1
fi
grep -E '^( alice|   bob|done in)' "$work/out.log" | tail -n 4
echo "passed in $((SECONDS - start)) s"
