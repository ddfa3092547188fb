#!/usr/bin/env bash
# Builds the previous release's `leasehold` for the version-skew test (crates/leasehold-cli/tests/
# skew.rs) and prints the binary's path: target/previous-release/leasehold-VERSION.
#
# The release is the newest CHANGELOG.md heading that names a commit ("## X.Y.Z — commit SHA"):
# a clone need not carry tags, but it has the history. Its sources are that commit's tree
# (git archive, so the clone gains no worktree entry), built with its own Cargo.lock into this
# checkout's target directory: dependencies both releases share are compiled once. Both
# workspaces uplift their binary to target/debug/leasehold, so the old one is copied out at once
# and the next cargo build of this checkout links its own back. Run again, it only prints the path.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

heading=$(grep -m1 -E '^## [0-9]+\.[0-9]+\.[0-9]+ — commit [0-9a-f]{40}$' CHANGELOG.md) || {
  echo "previous-release.sh: CHANGELOG.md names no released commit" >&2
  exit 1
}
version=$(awk '{print $2}' <<<"$heading")
commit=$(awk '{print $NF}' <<<"$heading")
target=${CARGO_TARGET_DIR:-$root/target}
out=$target/previous-release
binary=$out/leasehold-$version
mkdir -p "$out"

# Tests may ask for the build from several processes at once: one builds, the others wait.
exec 9>"$out/.lock"
flock 9
if [ -x "$binary" ] && [ "$(cat "$binary.commit" 2>/dev/null)" = "$commit" ]; then
  echo "$binary"
  exit 0
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "previous-release.sh: commit $commit of release $version is not in this clone (a shallow clone? fetch the full history)" >&2
  exit 1
fi
src=$out/src-$version
rm -rf "$src"
mkdir -p "$src"
git archive "$commit" | tar -x -C "$src"
started=$(date +%s)
echo "previous-release.sh: building leasehold $version from $commit" >&2
CARGO_TARGET_DIR=$target cargo build --locked --quiet --manifest-path "$src/Cargo.toml" \
  -p leasehold-cli --bin leasehold >&2
cp "$target/debug/leasehold" "$binary.tmp"
mv "$binary.tmp" "$binary"
echo "$commit" >"$binary.commit"
rm -rf "$src"
echo "previous-release.sh: built leasehold $version in $(($(date +%s) - started)) s" >&2
echo "$binary"
