#!/usr/bin/env bash
# Model load into GPU memory (BENCHMARKS.md, "Loading a model into a GPU"): a safetensors file
# loaded with safetensors' own loader (torch, device="cuda") from local disk, and the same
# file through `jfs mount`: at the primary with no local cache; at the primary from the local
# cache after `jfs warmup`, FUSE passthrough off and then on; at a mirror cold through the
# origin fallback (the mirror's copier held back); at a mirror once its copier has copied the
# blocks; and there from its local cache with passthrough. Page cache dropped before each
# load; each figure the median of ROUNDS. Without torch or CUDA the loads go to host
# memory (safetensors.numpy) and the table says so.
# Needs root (FUSE, drop_caches). Runs without cargo, on binaries built elsewhere:
#   JFS=path/jfs AGENT=path/mirror-agent PY=python-with-safetensors bash integration/bench-gpu-load.sh
#   SIZE_MB=2048 (model size, default) ROUNDS=3
set -euo pipefail
cd "$(dirname "$0")/.."
T=${CARGO_TARGET_DIR:-$HOME/.cache/jfs-target}/release
JFS=${JFS:-$T/jfs}
AGENT=${AGENT:-$T/mirror-agent}
PY=${PY:-python3}
SIZE_MB=${SIZE_MB:-2048}
ROUNDS=${ROUNDS:-3}
D=$(mktemp -d "${TMPDIR:-/tmp}/jfs-bench-gpu.XXXXXX")
PRIMARY=rocksdb://$D/primary/meta
MIRROR=rocksdb://$D/mirror/meta
M=$D/mnt
PIDS=()
cleanup() {
  local rc=$?
  if [ "$rc" != 0 ]; then
    for f in "$D"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }; done
  fi
  "$JFS" umount "$M" >/dev/null 2>&1 || "$JFS" umount --force "$M" >/dev/null 2>&1 || true
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true
  rm -rf "$D"
}
trap cleanup EXIT
COLD=yes
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || COLD=no; }
cpu_of() { python3 -c 'import os,sys; f=open(f"/proc/{sys.argv[1]}/stat").read().rsplit(")",1)[1].split(); print((int(f[11])+int(f[12]))/os.sysconf("SC_CLK_TCK"))' "$1"; }
mount_pid() { "$JFS" status "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["sessions"][0]["pid"])'; }
# q CMD...: quiet unless it fails.
q() { "$@" > "$D/q.out" 2>&1 || { cat "$D/q.out" >&2; return 1; }; }
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
WANT=
# load FILE [MOUNT-META]: ROUNDS cold loads; sets SECS (median), and CPU (the mount's CPU
# seconds per GiB loaded) when a mount's metadata URL is given.
load() {
  local ts=() out c0=0 pid=
  [ -n "${2:-}" ] && pid=$(mount_pid "$2") && c0=$(cpu_of "$pid")
  for _ in $(seq "$ROUNDS"); do
    drop
    out=$("$PY" integration/model_load.py load "$1")
    read -r s sum WHERE <<<"$out"
    [ -z "$WANT" ] && WANT=$sum
    [ "$sum" = "$WANT" ] || { echo "checksum of $1: $sum, local disk's: $WANT" >&2; exit 1; }
    ts+=("$s")
  done
  SECS=$(median "${ts[@]}")
  CPU=-
  [ -n "$pid" ] && CPU=$(python3 -c "print(f'{($(cpu_of "$pid") - $c0) / $ROUNDS / ($SIZE_MB / 1024):.2f}')")
  return 0
}
row() { python3 -c "import sys; n,s,l,c=sys.argv[1],float(sys.argv[2]),float(sys.argv[3]),sys.argv[4]; print(f'| {n} | {$SIZE_MB/s:.0f} MiB/s ({s:.2f} s) | {l/s:.2f} | {c} |')" "$1" "$2" "$T_LOCAL" "$3"; }

mkdir -p "$D/local" "$M"
PMETRICS=127.0.0.1:$(python3 -c 'import random; print(random.randrange(32000, 40000))')
"$PY" integration/model_load.py make "$D/local/model.safetensors" "$SIZE_MB"
SIZE_MB=$(( $(stat -c %s "$D/local/model.safetensors") >> 20 ))
q "$JFS" format "$PRIMARY" bench --storage "file://$D/primary/blocks"
q "$JFS" put "$PRIMARY" "$D/local/model.safetensors" /model.safetensors
HEAD=$("$JFS" status "$PRIMARY" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["journal"]["last"])')

load "$D/local/model.safetensors"; T_LOCAL=$SECS
echo "model load: $SIZE_MB MiB safetensors, loaded into $WHERE; $(nproc) cores; $(uname -r); $(date -u +%F)"
echo
echo "| load (median of $ROUNDS, page cache dropped: $COLD) | speed | vs local disk | mount CPU s/GiB |"
echo "|---|---|---|---|"
row "local disk" "$T_LOCAL" -

q "$JFS" mount "$PRIMARY" "$M" -d --cache-size 0 --log "$D/mount.log"
load "$M/model.safetensors" "$PRIMARY"; row "primary mount, no local cache (blocks from the store)" "$SECS" "$CPU"
q "$JFS" umount "$M"
q "$JFS" mount "$PRIMARY" "$M" -d --cache-dir "$D/cache-off" --cache-size 8G --free-space-ratio 0.01 --passthrough off --log "$D/mount.log"
q "$JFS" warmup "$M/model.safetensors"
load "$M/model.safetensors" "$PRIMARY"; row "primary mount, local cache after jfs warmup, passthrough off" "$SECS" "$CPU"
q "$JFS" umount "$M"
q "$JFS" mount "$PRIMARY" "$M" -d --metrics "$PMETRICS" --cache-dir "$D/cache" --cache-size 8G --free-space-ratio 0.01 --log "$D/mount.log"
q "$JFS" warmup "$M/model.safetensors"
load "$M/model.safetensors" "$PRIMARY"; row "primary mount, local cache after jfs warmup, passthrough" "$SECS" "$CPU"
PT=$(python3 -c 'import sys,urllib.request; t=urllib.request.urlopen(f"http://{sys.argv[1]}/metrics").read().decode()
print(next((l.split()[1] for l in t.splitlines() if l.startswith("jfs_passthrough_opens_total")), "?"))' "$PMETRICS" 2>/dev/null || echo "?")
q "$JFS" umount "$M"

# A mirror: its copier held back (bwlimit 1 byte/s), so every block comes through the fallback.
export BENCH_TOKEN BENCH_ADMIN
BENCH_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
BENCH_ADMIN=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
BASE=$(python3 -c 'import random; print(random.randrange(20000, 31990))')
LISTEN=127.0.0.1:$BASE PADMIN=127.0.0.1:$((BASE + 1)) MADMIN=127.0.0.1:$((BASE + 2))
printf '%s\n' 'role = "primary"' "meta = \"$PRIMARY\"" "state_dir = \"$D/primary/agent\"" \
  "admin = \"$PADMIN\"" '[primary]' "listen = \"$LISTEN\"" '[[primary.mirrors]]' 'name = "gpu"' \
  'token_env = "BENCH_TOKEN"' > "$D/primary.toml"
printf '%s\n' 'role = "mirror"' "meta = \"$MIRROR\"" "state_dir = \"$D/mirror/agent\"" \
  "admin = \"$MADMIN\"" 'admin_token_env = "BENCH_ADMIN"' '[mirror]' 'name = "gpu"' \
  "primary = \"$LISTEN\"" 'token_env = "BENCH_TOKEN"' "store = \"file://$D/mirror/blocks\"" \
  'bwlimit = "1"' > "$D/mirror.toml"
"$AGENT" run --config "$D/primary.toml" > "$D/primary-agent.log" 2>&1 & PIDS+=($!)
"$AGENT" run --config "$D/mirror.toml" > "$D/mirror-agent.log" 2>&1 & PIDS+=($!)
applied() { "$AGENT" status --admin "$MADMIN" --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin).get("applied_seq") or 0)' 2>/dev/null || echo 0; }
for _ in $(seq 600); do [ "$(applied)" -ge "$HEAD" ] && break; sleep 0.2; done
[ "$(applied)" -ge "$HEAD" ] || { tail -20 "$D/mirror-agent.log" >&2; exit 1; }
q "$JFS" mount "$MIRROR" "$M" -d --cache-size 0 --log "$D/mirror-mount.log"
load "$M/model.safetensors" "$MIRROR"; row "mirror mount, cold, every block through the origin fallback" "$SECS" "$CPU"
q "$JFS" umount "$M"
MIRROR_AGENT_ADMIN_TOKEN=$BENCH_ADMIN "$AGENT" limits --admin "$MADMIN" --bwlimit off >/dev/null
for _ in $(seq 600); do
  "$AGENT" status --admin "$MADMIN" --json | python3 -c 'import json,sys; b=json.load(sys.stdin)["blocks"]
sys.exit(0 if b["pending"] == 0 and b["queued_through"] >= int(sys.argv[1]) else 1)' "$HEAD" && break
  sleep 0.2
done
q "$JFS" mount "$MIRROR" "$M" -d --cache-size 0 --log "$D/mirror-mount.log"
load "$M/model.safetensors" "$MIRROR"; row "mirror mount, blocks copied to the mirror's store" "$SECS" "$CPU"
q "$JFS" umount "$M"
q "$JFS" mount "$MIRROR" "$M" -d --cache-dir "$D/mcache" --cache-size 8G --free-space-ratio 0.01 --log "$D/mirror-mount.log"
q "$JFS" warmup "$M/model.safetensors"
load "$M/model.safetensors" "$MIRROR"; row "mirror mount, local cache after jfs warmup, passthrough" "$SECS" "$CPU"
q "$JFS" umount "$M"
echo
echo "opens answered with passthrough at the primary's cached mount: ${PT:-unknown}, over $ROUNDS loads"
