#!/usr/bin/env bash
# Builds the book (docs/, an mdBook) into docs/book/ and checks it: scripts/check_docs.py first (every
# relative link, anchor and {{#include}} resolves, every page is in SUMMARY.md, the troubleshooting
# page's quoted messages are still in the code), then `mdbook build`. mdbook comes from crates.io at a
# pinned version, installed into .tools/ (git-ignored) on first use; a stamp makes later runs skip it.
# scripts/test.sh installs mdbook beside setup and runs the rest beside pytest. The generated reference pages are checked by `cargo test`
# (server/src/reference.rs).
#
#   scripts/build_docs.sh                 # install mdbook if needed, check, build
#   scripts/build_docs.sh --install-only  # only install mdbook (scripts/test.sh: beside setup)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

MDBOOK_VERSION=0.5.4
tools="$root/.tools"
mdbook="$tools/bin/mdbook"
stamp="$tools/mdbook.version"

if [[ ! -x "$mdbook" || "$(cat "$stamp" 2>/dev/null)" != "$MDBOOK_VERSION" ]]; then
    started=$SECONDS
    # Without the default features (a file watcher and a web server for `mdbook serve`): `build` is all
    # CI needs, and they are most of the build. Its own target dir, removed after: only the binary stays.
    cargo install mdbook --locked --version "$MDBOOK_VERSION" --no-default-features \
        --root "$tools" --target-dir "$tools/build" --quiet
    rm -rf "$tools/build"
    echo "$MDBOOK_VERSION" > "$stamp"
    echo "build_docs: installed mdbook $MDBOOK_VERSION into .tools/ in $((SECONDS - started)) s"
fi

[[ "${1:-}" == --install-only ]] && exit 0

python3 scripts/check_docs.py
# mdbook exits non-zero on a missing page or a bad SUMMARY.md; its warnings (e.g. a missing include,
# which check_docs.py already refuses) are made fatal here too.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! "$mdbook" build docs > "$log" 2>&1 || grep -qE '\b(WARN|ERROR)\b' "$log"; then
    cat "$log"
    echo "build_docs: mdbook build docs failed or warned (above)"
    exit 1
fi
echo "build_docs: docs/book/ built ($(find docs/book -name '*.html' | wc -l) HTML pages)"
