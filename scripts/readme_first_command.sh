#!/usr/bin/env bash
# What a new user does first, from the root of a fresh clone of HEAD (committed work
# only): the README's first command exactly as written — a plain, non-editable install,
# then `svc demo` — and then the README's Python example against `svc up`, with the key
# from `svc signup`. Fails unless both succeed.
#
# Both are read from the README (the first line of its first ```sh block, and its first
# ```python block), so this follows the README when it changes. CARGO_TARGET_DIR points
# the build at this checkout's target/ only as a cache of compiled dependencies; the
# clone's own sources are what gets built and installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

command=$(awk '/^```sh$/ { getline; print; exit }' "$root/README.md")
example=$(awk '/^```python$/ { inside = 1; next } inside && /^```$/ { exit } inside' "$root/README.md")
if [ -z "$command" ] || [ -z "$example" ]; then
    echo "README.md lacks a \`\`\`sh block (the first command) or a \`\`\`python block" >&2
    exit 1
fi

work=$(mktemp -d)
server=""
cleanup() {
    [ -z "$server" ] || kill "$server" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
git clone -q "$root" "$work/svc"
cd "$work/svc"

echo "\$ $command"
start=$SECONDS
if ! CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" PIP_DISABLE_PIP_VERSION_CHECK=1 \
    timeout 1800 bash -c "$command" >"$work/first.log" 2>&1; then
    tail -n 60 "$work/first.log" >&2
    echo "the README's first command failed from a fresh clone" >&2
    exit 1
fi
grep -E '^( *alice| *bob|done in)' "$work/first.log" | tail -n 3
echo "first command passed in $((SECONDS - start)) s"

# The Python example, run from the clone's root like the demo, as a user with a fresh
# home: `svc up` on free ports (named to the example through SVC_API_URL and SVC_RELAY).
start=$SECONDS
ports=$(.venv/bin/python -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')
read -r api_port relay_port <<<"$ports"
export HOME="$work/home" SVC_API_URL="http://127.0.0.1:$api_port"
export SVC_RELAY="http://127.0.0.1:$relay_port" SVC_DATA_DIR=""
mkdir -p "$HOME"
.venv/bin/svc up --api-port "$api_port" --relay-port "$relay_port" --data-dir "$work/server" \
    >"$work/up.log" 2>&1 &
server=$!
for _ in $(seq 100); do
    grep -q '^ready' "$work/up.log" && break
    sleep 0.2
done
if ! .venv/bin/svc signup ada@example.com >"$work/signup.log" 2>&1; then
    cat "$work/up.log" "$work/signup.log" >&2
    exit 1
fi
if ! out=$(timeout 300 .venv/bin/python - <<<"$example" 2>&1); then
    echo "$out" >&2
    echo "the README's Python example failed from a fresh clone" >&2
    exit 1
fi
echo "$out"
[ "$out" = "['hello bob']" ] || { echo "expected ['hello bob']" >&2; exit 1; }
echo "Python example passed in $((SECONDS - start)) s"
