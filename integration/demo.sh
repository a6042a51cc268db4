#!/usr/bin/env bash
# README command 1: the main job on embedded defaults (RocksDB metadata, a local directory as
# the object store). A primary volume is written; a second site gets its metadata (a dump
# loaded into its own RocksDB: until the mirror agent lands, the copy is made by hand) and
# reads every file back, byte for byte, from the shared block store.
set -euo pipefail
cd "$(dirname "$0")/.."
bash integration/install-deps.sh build
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/jfs-target}
cargo build --release --locked -p jfs
JFS=$CARGO_TARGET_DIR/release/jfs
D=${DEMO_DIR:-$(mktemp -d /tmp/jfs-demo.XXXXXX)}
mkdir -p "$D"
PRIMARY=rocksdb://$D/primary-meta
MIRROR=rocksdb://$D/mirror-meta
say() { printf '\n== %s\n' "$*"; }

say "a sample tree: a 64 MiB 'model', 200 small files, a symlink"
mkdir -p "$D/src/shards"
head -c $((64 << 20)) /dev/urandom > "$D/src/model.bin"
for i in $(seq 1 200); do head -c $((RANDOM % 8000 + 1)) /dev/urandom > "$D/src/shards/part-$i"; done
ln -sf model.bin "$D/src/latest"

say "format a volume: metadata in RocksDB, blocks in a local directory"
$JFS format "$PRIMARY" demo --storage "file://$D/blocks"
say "write it (jfs put) at the primary"
$JFS put "$PRIMARY" "$D/src" /models
$JFS ls -l "$PRIMARY" /models | head -5
say "the change journal (last entries)"
$JFS journal "$PRIMARY" | tail -4
say "second site: copy the metadata (dump, then load into its own RocksDB)"
$JFS dump "$PRIMARY" "$D/meta.json"
$JFS load "$MIRROR" "$D/meta.json"
say "read everything back at the second site and compare"
rm -rf "$D/readback"
$JFS get "$MIRROR" /models "$D/readback"
diff -r "$D/src" "$D/readback"
echo "byte-identical: $(find "$D/readback" -type f | wc -l) files"
say "fsck and status"
$JFS fsck "$MIRROR"
$JFS status "$PRIMARY"
echo
echo "demo done; everything is under $D"
