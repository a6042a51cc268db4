#!/usr/bin/env bash
# README command 2: install what the tests need, start private Redis, PostgreSQL and an S3
# server (Ceph RGW) on loopback, run the whole test suite, stop the services.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
bash integration/install-deps.sh test
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/jfs-target}
# Incremental compilation only helps edit-build loops; here it costs gigabytes of disk.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
export CARGO_TERM_COLOR=never
cargo fmt --all -- --check || { echo "test.sh: code is not formatted: run cargo fmt --all" >&2; exit 1; }
# std's eprintln!/eprint! panic when stderr is a closed pipe: the binaries use cli_common's.
if grep -rnE '(^|[^:_a-z])eprint(ln)?!' --include='*.rs' crates fs-core mirror-agent sync-cli | grep -v '^crates/cli-common/'; then
    echo "test.sh: std eprintln!/eprint! above: use cli_common::eprintln!/eprint! (a closed stderr must end no work)" >&2; exit 1
fi
cargo build --workspace --all-targets --locked
SVC=$(mktemp -d /tmp/jfs-svc.XXXXXX)
cleanup() { bash integration/services.sh down "$SVC" || true; rm -rf "$SVC"; }
trap cleanup EXIT
bash integration/services.sh up "$SVC"
# shellcheck disable=SC1091
source "$SVC/env"
export JFS_PJDFSTEST=${JFS_TOOLS_DIR:-$HOME/.cache/jfs-tools}/bin/pjdfstest
cargo test --workspace --locked --no-fail-fast
echo "test.sh: whole suite finished in $(( $(date +%s) - t0 ))s"
