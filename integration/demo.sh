#!/usr/bin/env bash
# README command 1: the main job on embedded defaults (RocksDB metadata, local directories
# as object stores). A primary volume and a mirror site, each with its own mirror-agent
# process: files written at the primary appear at the mirror (metadata applied from the
# journal, blocks copied to the mirror's own store) and read back byte-identical there.
# The primary is mounted read-write (FUSE) and written through the mount; the mirror is
# mounted read-only and read through its mount: first with its copier held back, so the
# reads fall back to the origin store (and fill the mirror's store), then with it released.
set -euo pipefail
cd "$(dirname "$0")/.."
bash integration/install-deps.sh demo
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
MIRROR_DEMO_ADMIN=$(openssl rand -hex 24)
export MIRROR_DEMO_TOKEN MIRROR_DEMO_ADMIN
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
admin_token_env = "MIRROR_DEMO_ADMIN"
[mirror]
name = "site-b"
primary = "$LISTEN"
token_env = "MIRROR_DEMO_TOKEN"
store = "file://$D/mirror/blocks"
window = "1s"
workers = 8
# Held back (1 byte/s) so that the first reads at the mirror go to the origin; released below.
bwlimit = "1"
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

applied() { $AGENT status --admin "$MADMIN" --json | python3 -c 'import json,sys; print(json.load(sys.stdin).get("applied_seq") or 0)'; }
say "wait until the mirror has applied seq $HEAD (its copier is held back: no block copied yet)"
for _ in $(seq 600); do [ "$(applied)" -ge "$HEAD" ] && break; sleep 0.2; done
[ "$(applied)" -ge "$HEAD" ] || { echo "the mirror did not apply seq $HEAD in 120 s" >&2; exit 1; }
echo "blocks in the mirror's store: $(find "$D/mirror/blocks" -type f 2>/dev/null | wc -l)"

say "mount the mirror (its metadata says it is one: read-only) and compare through it"
$JFS mount "$MIRROR" "$D/mirror-mnt" -d --cache-dir "$D/mirror-cache" --log "$D/mirror-mount.log"
MOUNTS+=("$D/mirror-mnt")
diff -r "$D/src" "$D/mirror-mnt/models"
echo "byte-identical through the mirror's mount: $(find "$D/mirror-mnt/models" -type f | wc -l) files"
$JFS stats "$D/mirror-mnt" --json --count 1 | python3 -c 'import json,sys; m=json.loads(sys.stdin.read().splitlines()[-1]); print("read from the origin (fallback): %d blocks, %d MiB; filled into the mirror store: %d" % (m.get("jfs_fallback_reads_total",0), m.get("jfs_fallback_bytes_total",0)/2**20, m.get("jfs_fills_total",0)))'
if touch "$D/mirror-mnt/models/x" 2>/dev/null; then echo "a mirror mount accepted a write" >&2; exit 1; fi
echo "writes at the mirror's mount are refused (read-only)"

say "release the copier; wait until every block is at the mirror"
MIRROR_AGENT_ADMIN_TOKEN=$MIRROR_DEMO_ADMIN $AGENT limits --admin "$MADMIN" --bwlimit off
$AGENT status --admin "$MADMIN" --wait-applied "$HEAD" --timeout 120s
echo "blocks in the mirror's store: $(find "$D/mirror/blocks" -type f | wc -l)"

say "one more change at the primary: it shows up at the mirror's mount within the window"
echo "v2 of the notes" > "$D/primary-mnt/models/notes.txt"
T0=$(date +%s.%N)
for _ in $(seq 100); do grep -q v2 "$D/mirror-mnt/models/notes.txt" 2>/dev/null && break; sleep 0.05; done
grep v2 "$D/mirror-mnt/models/notes.txt"
echo "visible at the mirror after $(python3 -c "import time; print(f'{time.time()-$T0:.2f}')") s"
$AGENT status --admin "$MADMIN" | grep -E "applied|lag|window"
sleep 1 # the primary records acknowledgements every 500 ms

say "the primary's view: replication slot, acknowledged seq"
$AGENT status --admin "$PADMIN"
echo
echo "demo done; everything is under $D (agent logs: $D/*-agent.log)"
