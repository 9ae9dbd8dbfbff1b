#!/usr/bin/env bash
# Pack every test binary (release builds, stripped) into .bench/tests.tar.xz, small enough to
# carry to a GPU machine without a Rust toolchain (22 binaries: about 13 MB), where
# scripts/tests-h200.sh runs them from the repository root (the MSL snapshot test reads
# tests/golden there).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
mkdir -p "$dir/tb" .bench
cargo test --release --no-run --message-format=json 2>/dev/null |
  grep -E '"kind":\["(lib|test)"\]' | grep -o '"executable":"[^"]*"' | sed 's/"executable":"//; s/"$//' | sort -u |
  while read -r exe; do
    cp "$exe" "$dir/tb/$(basename "$exe" | sed 's/-[0-9a-f]*$//')"
  done
strip "$dir"/tb/* 2> /dev/null || true
tar -C "$dir" -cJf .bench/tests.tar.xz tb
echo "$(ls "$dir/tb" | wc -l) test binaries in .bench/tests.tar.xz ($(du -h .bench/tests.tar.xz | cut -f1))"
rm -rf "$dir"
