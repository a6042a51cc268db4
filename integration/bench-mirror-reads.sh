#!/usr/bin/env bash
# Mirror-site read benchmarks (BENCHMARKS.md, "Mirror-site reads"): a primary and a mirror on
# this machine (RocksDB metadata, local-directory stores), the mirror mounted with `jfs mount`.
#  1. cold read of a model file entirely through the origin fallback (the mirror's copier
#     held back) vs reading the origin store's block files directly;
#  2. time to first byte of a 4 MiB read through the fallback vs a direct read of the block;
#  3. once the copier has copied everything: loading a safetensors-shaped model file (header
#     + tensors, read through mmap as safetensors does) through the mirror mount vs from
#     local disk;
#  4. the origin behind a 100 Mbit/s `tc tbf` link (served over HTTP in one network
#     namespace, the mirror mount in another, an empty mirror store): a cold read all through
#     the fallback, and `jfs warmup` of the same file, vs curl fetching the blocks over the
#     same link.
# Needs root (drop_caches, netns, tc).   bash integration/bench-mirror-reads.sh
# SIZE_MB=256 (model file, default 1024), LINK_MB=128 (file read over the link, default 256),
# PARTS=13 (which parts to run, default 1234; part 3 needs part 1's mount to have been made).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/jfs-target}
cargo build --release --locked -p jfs -p mirror-agent >/dev/null
JFS=$CARGO_TARGET_DIR/release/jfs
AGENT=$CARGO_TARGET_DIR/release/mirror-agent
SIZE_MB=${SIZE_MB:-1024}
LINK_MB=${LINK_MB:-256}
PARTS=${PARTS:-1234}
D=$(mktemp -d /tmp/jfs-bench-mirror.XXXXXX)
NSA=jfsbrA$$ NSB=jfsbrB$$
PRIMARY=rocksdb://$D/primary/meta
MIRROR=rocksdb://$D/mirror/meta
MM=$D/mirror-mnt
PIDS=()
cleanup() {
  "$JFS" umount "$MM" >/dev/null 2>&1 || "$JFS" umount --force "$MM" >/dev/null 2>&1 || true
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true
  ip netns del "$NSA" 2>/dev/null || true; ip netns del "$NSB" 2>/dev/null || true
  rm -rf "$D"
}
trap cleanup EXIT
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
secs() { python3 -c 'import sys,time,subprocess; t=time.time(); subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); print(f"{time.time()-t:.3f}")' "$@"; }
mbps() { python3 -c "print(f'{$SIZE_MB/$1:.0f}')"; }
ratio() { python3 -c "print(f'{$1/$2:.2f}')"; }
export BENCH_TOKEN BENCH_ADMIN
BENCH_TOKEN=$(openssl rand -hex 24)
BENCH_ADMIN=$(openssl rand -hex 24)
BASE=$(shuf -i 20000-31990 -n 1)
LISTEN=127.0.0.1:$BASE; PADMIN=127.0.0.1:$((BASE + 1)); MADMIN=127.0.0.1:$((BASE + 2))

# A safetensors-shaped file: 8-byte header length, a JSON header, then the tensors.
mkdir -p "$D/local" "$MM"
python3 - "$D/local/model.safetensors" "$SIZE_MB" <<'PY'
import json, os, struct, sys
path, mb = sys.argv[1], int(sys.argv[2])
n = max(1, mb // 64)
per = (mb << 20) // n
hdr, off = {}, 0
for i in range(n):
    hdr[f"layer.{i}.weight"] = {"dtype": "F16", "shape": [per // 2], "data_offsets": [off, off + per]}
    off += per
h = json.dumps(hdr).encode()
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h))); f.write(h)
    for i in range(n):
        f.write(os.urandom(per))
PY
head -c $((8 << 20)) /dev/urandom > "$D/local/ttfb.bin"
head -c $((LINK_MB << 20)) /dev/urandom > "$D/local/link.bin"
LOAD='import json, mmap, struct, sys
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    n = struct.unpack("<Q", m[:8])[0]
    hdr = json.loads(m[8:8 + n])
    base, total = 8 + n, 0
    for name, t in hdr.items():
        a, b = t["data_offsets"]
        total += len(bytes(m[base + a:base + b]))   # the copy torch makes into its tensor
    assert total == sum(t["data_offsets"][1] - t["data_offsets"][0] for t in hdr.values())'
TTFB='import sys, time
t = time.time()
with open(sys.argv[1], "rb") as f:
    assert len(f.read(4 << 20)) == 4 << 20
print(f"{(time.time() - t) * 1000:.1f}")'

"$JFS" format "$PRIMARY" bench --storage "file://$D/primary/blocks" >/dev/null
"$JFS" put "$PRIMARY" "$D/local/model.safetensors" /model.safetensors
"$JFS" put "$PRIMARY" "$D/local/ttfb.bin" /ttfb.bin
"$JFS" put "$PRIMARY" "$D/local/link.bin" /link.bin
HEAD=$("$JFS" status "$PRIMARY" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["journal"]["last"])')
cat > "$D/primary.toml" <<TOML
role = "primary"
meta = "$PRIMARY"
state_dir = "$D/primary/agent"
admin = "$PADMIN"
[primary]
listen = "$LISTEN"
[[primary.mirrors]]
name = "bench"
token_env = "BENCH_TOKEN"
TOML
cat > "$D/mirror.toml" <<TOML
role = "mirror"
meta = "$MIRROR"
state_dir = "$D/mirror/agent"
admin = "$MADMIN"
admin_token_env = "BENCH_ADMIN"
[mirror]
name = "bench"
primary = "$LISTEN"
token_env = "BENCH_TOKEN"
store = "file://$D/mirror/blocks"
bwlimit = "1"
TOML
"$AGENT" run --config "$D/primary.toml" > "$D/primary-agent.log" 2>&1 & PIDS+=($!)
"$AGENT" run --config "$D/mirror.toml" > "$D/mirror-agent.log" 2>&1 & PIDS+=($!)
applied() { "$AGENT" status --admin "$MADMIN" --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin).get("applied_seq") or 0)' 2>/dev/null || echo 0; }
for _ in $(seq 600); do [ "$(applied)" -ge "$HEAD" ] && break; sleep 0.2; done
echo "mirror benchmark: $SIZE_MB MiB model file; $(nproc) cores; $(date -u +%F)"
echo

# 1-2: everything through the fallback (nothing copied yet).
if [[ $PARTS == *[12]* ]]; then
"$JFS" mount "$MIRROR" "$MM" -d --cache-size 0 --log "$D/mirror-mount.log" >/dev/null
# (the origin holds the model's blocks and the 8 MiB of ttfb.bin: <1% more bytes than the model)
drop; t_direct=$(secs sh -c "find '$D/primary/blocks' -path '*/chunks/*' -type f | sort | xargs cat > /dev/null")
drop; ttfb_fb=$(python3 -c "$TTFB" "$MM/ttfb.bin")
FIRST=$(find "$D/primary/blocks" -path '*chunks*' -type f -name '*_0_4194304' | sort | tail -1)
drop; ttfb_direct=$(python3 -c "$TTFB" "$FIRST" 2>/dev/null || echo "n/a")
drop; t_fb=$(secs dd if="$MM/model.safetensors" of=/dev/null bs=1M status=none)
cmp "$D/local/model.safetensors" "$MM/model.safetensors"
echo "| cold read, all through the origin fallback | origin block files read directly | mirror mount | ratio |"
echo "|---|---|---|---|"
echo "| $SIZE_MB MiB, dd bs=1M | $(mbps "$t_direct") MiB/s (all blocks, cat) | $(mbps "$t_fb") MiB/s | $(ratio "$t_direct" "$t_fb") |"
echo
echo "time to first byte of a 4 MiB read: through the fallback ${ttfb_fb} ms; one origin block file read directly ${ttfb_direct} ms"
"$JFS" umount "$MM" >/dev/null
fi

# 3: the copier released; the model loads from the mirror's own store.
if [[ $PARTS == *3* ]]; then
MIRROR_AGENT_ADMIN_TOKEN=$BENCH_ADMIN "$AGENT" limits --admin "$MADMIN" --bwlimit off >/dev/null
"$AGENT" status --admin "$MADMIN" --wait-applied "$HEAD" --timeout 600s >/dev/null
"$JFS" mount "$MIRROR" "$MM" -d --cache-size 0 --log "$D/mirror-mount.log" >/dev/null
drop; t_load_local=$(secs python3 -c "$LOAD" "$D/local/model.safetensors")
drop; t_load_mm=$(secs python3 -c "$LOAD" "$MM/model.safetensors")
echo
echo "| load a $SIZE_MB MiB safetensors-shaped model (mmap, every tensor copied) | local disk | mirror mount (blocks at the mirror) | ratio |"
echo "|---|---|---|---|"
echo "| cold (page cache dropped) | $(mbps "$t_load_local") MiB/s | $(mbps "$t_load_mm") MiB/s | $(ratio "$t_load_local" "$t_load_mm") |"
"$JFS" umount "$MM" >/dev/null
fi
[[ $PARTS == *4* ]] || exit 0

# 4: the origin behind a 100 Mbit/s link. Namespace A serves the origin's block directory over
# HTTP, its side of the veth shaped by tbf; the mirror mount runs in namespace B (its own
# mount namespace too, so the reads run in the same `ip netns exec`), over an empty mirror
# store so that every block crosses the link.
ip netns add "$NSA"; ip netns add "$NSB"
ip link add "va$$" type veth peer name "vb$$"
ip link set "va$$" netns "$NSA"; ip link set "vb$$" netns "$NSB"
ip -n "$NSA" addr add 10.79.0.1/24 dev "va$$"; ip -n "$NSB" addr add 10.79.0.2/24 dev "vb$$"
for ns in "$NSA" "$NSB"; do ip -n "$ns" link set lo up; done
ip -n "$NSA" link set "va$$" up; ip -n "$NSB" link set "vb$$" up
ip netns exec "$NSA" tc qdisc add dev "va$$" root tbf rate 100mbit burst 256kb latency 100ms
ip netns exec "$NSA" python3 -m http.server 8080 --bind 10.79.0.1 --directory "$D/primary/blocks" >/dev/null 2>&1 & PIDS+=($!)
for _ in $(seq 50); do ip netns exec "$NSB" curl -s -o /dev/null http://10.79.0.1:8080/ && break; sleep 0.1; done
ORIGIN="opendal+http://?endpoint=http://10.79.0.1:8080"
LINKKEYS=$(cd "$D/primary/blocks" && find . -path '*chunks*' -type f -size +1M | sort | head -$((LINK_MB / 4)) | sed 's|^\./||' | tr '\n' ' ')
export JFS MIRROR ORIGIN D LINK_MB LINKKEYS
ip netns exec "$NSB" bash -euo pipefail -c '
  t() { python3 -c "import sys,time,subprocess; t=time.time(); subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(f\"{time.time()-t:.3f}\")" "$@"; }
  # Peer: curl, one stream, as many 4 MiB blocks as the file has.
  t_curl=$(t sh -c "for k in $LINKKEYS; do curl -sS -o /dev/null http://10.79.0.1:8080/\$k; done")
  mkdir -p "$D/mm-link" "$D/empty-1" "$D/empty-2"
  "$JFS" --block-store "file://$D/empty-1" --origin-store "$ORIGIN" mount "$MIRROR" "$D/mm-link" -d --cache-size 0 --log "$D/link-mount.log" >/dev/null
  sync; echo 3 > /proc/sys/vm/drop_caches
  t_read=$(t dd if="$D/mm-link/link.bin" of=/dev/null bs=1M status=none)
  cmp "$D/local/link.bin" "$D/mm-link/link.bin"
  "$JFS" umount "$D/mm-link" >/dev/null
  "$JFS" --block-store "file://$D/empty-2" --origin-store "$ORIGIN" mount "$MIRROR" "$D/mm-link" -d --cache-dir "$D/link-cache" --cache-size 2G --free-space-ratio 0.01 --log "$D/link-mount.log" >/dev/null
  t_warm=$(t "$JFS" warmup "$D/mm-link/link.bin" --threads 16)
  "$JFS" umount "$D/mm-link" >/dev/null
  python3 - "$LINK_MB" "$t_curl" "$t_read" "$t_warm" <<PY
import sys
mb, c, r, w = int(sys.argv[1]), *map(float, sys.argv[2:])
mbit = lambda s: mb * 8 * 1.048576 / s
print()
print(f"| origin behind a 100 Mbit/s tbf link, {mb} MiB file, empty mirror store | Mbit/s | share of the link (100) | vs curl |")
print("|---|---|---|---|")
print(f"| curl, the same blocks one after another | {mbit(c):.1f} | {mbit(c):.0f}% | 1.00 |")
print(f"| cold read through the mirror mount (dd bs=1M), all fallback | {mbit(r):.1f} | {mbit(r):.0f}% | {c / r:.2f} |")
print(f"| jfs warmup of the file at the mirror mount (local cache + mirror store filled) | {mbit(w):.1f} | {mbit(w):.0f}% | {c / w:.2f} |")
PY
'
