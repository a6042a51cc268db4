#!/usr/bin/env bash
# README command 1: the main job on embedded defaults (RocksDB metadata, local directories
# as object stores). A primary volume and a mirror site, each with its own mirror-agent
# process: files written at the primary appear at the mirror (metadata applied from the
# journal, blocks copied to the mirror's own store) and read back byte-identical there.
# The primary is mounted read-write (FUSE) and written through the mount; the mirror is
# mounted read-only and read through its mount.
set -euo pipefail
cd "$(dirname "$0")/.."
bash integration/install-deps.sh build
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/jfs-target}
cargo build --release --locked -p jfs -p mirror-agent
BIN=$CARGO_TARGET_DIR/release
JFS=$BIN/jfs
AGENT=$BIN/mirror-agent
D=${DEMO_DIR:-$(mktemp -d /tmp/jfs-demo.XXXXXX)}
mkdir -p "$D"
PRIMARY=rocksdb://$D/primary/meta
MIRROR=rocksdb://$D/mirror/meta
say() { printf '\n== %s\n' "$*"; }
PIDS=()
MOUNTS=()
cleanup() {
  for m in "${MOUNTS[@]}"; do $JFS umount "$m" >/dev/null 2>&1 || $JFS umount --force "$m" >/dev/null 2>&1 || true; done
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true
}
trap cleanup EXIT
# The mirror's token: from the environment, never on a command line or in a config file.
MIRROR_DEMO_TOKEN=$(openssl rand -hex 24)
export MIRROR_DEMO_TOKEN
BASE=$(shuf -i 20000-31990 -n 1) # below the ephemeral port range
LISTEN=127.0.0.1:$BASE; PADMIN=127.0.0.1:$((BASE + 1)); MADMIN=127.0.0.1:$((BASE + 2))

say "a sample tree: a 64 MiB 'model', 200 small files, a symlink"
mkdir -p "$D/src/shards"
head -c $((64 << 20)) /dev/urandom > "$D/src/model.bin"
for i in $(seq 1 200); do head -c $((RANDOM % 8000 + 1)) /dev/urandom > "$D/src/shards/part-$i"; done
ln -sf model.bin "$D/src/latest"

say "format the primary volume: metadata in RocksDB, blocks in $D/primary/blocks"
$JFS format "$PRIMARY" demo --storage "file://$D/primary/blocks"

say "start the primary agent (serves the journal) and the mirror agent (applies it, copies blocks)"
cat > "$D/primary.toml" <<TOML
role = "primary"
meta = "$PRIMARY"
state_dir = "$D/primary/agent"
admin = "$PADMIN"
[primary]
listen = "$LISTEN"
[[primary.mirrors]]
name = "site-b"
token_env = "MIRROR_DEMO_TOKEN"
TOML
cat > "$D/mirror.toml" <<TOML
role = "mirror"
meta = "$MIRROR"
state_dir = "$D/mirror/agent"
admin = "$MADMIN"
[mirror]
name = "site-b"
primary = "$LISTEN"
token_env = "MIRROR_DEMO_TOKEN"
store = "file://$D/mirror/blocks"
window = "1s"
workers = 8
TOML
$AGENT run --config "$D/primary.toml" > "$D/primary-agent.log" 2>&1 & PIDS+=($!)
$AGENT run --config "$D/mirror.toml" > "$D/mirror-agent.log" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do $AGENT status --admin "$MADMIN" >/dev/null 2>&1 && break; sleep 0.1; done

say "mount the primary read-write at $D/primary-mnt and write through it while the agents run"
mkdir -p "$D/primary-mnt" "$D/mirror-mnt"
$JFS mount "$PRIMARY" "$D/primary-mnt" -d --cache-dir "$D/cache" --log "$D/primary-mount.log"
MOUNTS+=("$D/primary-mnt")
cp -a "$D/src" "$D/primary-mnt/models"
ls -l "$D/primary-mnt/models" | head -5
HEAD=$($JFS status "$PRIMARY" --json | grep -o '"last": *[0-9]*' | grep -o '[0-9]*$')

say "wait until the mirror has applied seq $HEAD and copied every block"
$AGENT status --admin "$MADMIN" --wait-applied "$HEAD" --timeout 120s

say "mount the mirror read-only (its metadata, its own block store) and compare through it"
$JFS --block-store "file://$D/mirror/blocks" mount "$MIRROR" "$D/mirror-mnt" --read-only -d --cache-dir "$D/cache" --log "$D/mirror-mount.log"
MOUNTS+=("$D/mirror-mnt")
diff -r "$D/src" "$D/mirror-mnt/models"
echo "byte-identical through the mirror's mount: $(find "$D/mirror-mnt/models" -type f | wc -l) files"
if touch "$D/mirror-mnt/models/x" 2>/dev/null; then echo "a mirror mount accepted a write" >&2; exit 1; fi
echo "writes at the mirror's mount are refused (read-only)"

say "one more change at the primary: it shows up at the mirror within the window"
echo "v2 of the notes" > "$D/primary-mnt/models/notes.txt"
for _ in $(seq 50); do
  $JFS --block-store "file://$D/mirror/blocks" cat "$MIRROR" /models/notes.txt 2>/dev/null | grep -q v2 && break; sleep 0.1
done
$JFS --block-store "file://$D/mirror/blocks" cat "$MIRROR" /models/notes.txt
$AGENT status --admin "$MADMIN" | grep -E "applied|lag|window"
sleep 1 # the primary records acknowledgements every 500 ms

say "the primary's view: replication slot, acknowledged seq"
$AGENT status --admin "$PADMIN"
echo
echo "demo done; everything is under $D (agent logs: $D/*-agent.log)"
