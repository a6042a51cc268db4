#!/usr/bin/env bash
# Install what building (`build`), the demo (`demo`: building, FUSE and what its checks
# use) or building and testing (`test`) needs, from Debian's packages. Idempotent and quiet
# when everything is present; fails loudly when it cannot.
set -euo pipefail
what=${1:-test}
case "$what" in build|demo|test) ;; *) echo "install-deps: usage: install-deps.sh build|demo|test" >&2; exit 2;; esac
build_pkgs=(librocksdb-dev openssl libsnappy-dev liblz4-dev libzstd-dev libbz2-dev zlib1g-dev libclang-dev clang pkg-config)
demo_pkgs=(fuse3 python3)
test_pkgs=(redis-server postgresql iproute2 iptables ceph-mon ceph-osd radosgw uuid-runtime curl python3 fuse3 rclone rsync time)
pkgs=("${build_pkgs[@]}")
[ "$what" = demo ] && pkgs+=("${demo_pkgs[@]}")
[ "$what" = test ] && pkgs+=("${test_pkgs[@]}")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Prove the tools are really there (a package can install without the binary we need).
need=(cargo openssl)
[ "$what" = demo ] && need+=(python3)
[ "$what" = test ] && need+=(ip redis-server redis-cli psql /usr/lib/postgresql/15/bin/initdb ceph-mon ceph-osd radosgw radosgw-admin uuidgen curl rclone)
for c in "${need[@]}"; do
  command -v "$c" >/dev/null 2>&1 || [ -x "$c" ] || { echo "install-deps: $c is still missing after installing packages" >&2; exit 1; }
done
[ -e /usr/lib/x86_64-linux-gnu/librocksdb.so ] || { echo "install-deps: librocksdb.so not found (librocksdb-dev)" >&2; exit 1; }
if [ "$what" = test ] || [ "$what" = demo ]; then
  # FUSE: mounts need the device and fusermount3 (auto-unmount).
  command -v fusermount3 >/dev/null || { echo "install-deps: fusermount3 is missing (fuse3)" >&2; exit 1; }
  [ -e /dev/fuse ] || { echo "install-deps: /dev/fuse is missing: mounts need FUSE (run with --device /dev/fuse in a container)" >&2; exit 1; }
fi
if [ "$what" = test ]; then
  # pjdfstest, pinned, cached outside the clone like the target dir.
  tools=${JFS_TOOLS_DIR:-$HOME/.cache/jfs-tools}
  if [ ! -x "$tools/bin/pjdfstest" ]; then
    echo "install-deps: installing pjdfstest 0.2.2 into $tools"
    cargo install pjdfstest --version 0.2.2 --locked --root "$tools" --quiet
  fi
  [ -x "$tools/bin/pjdfstest" ] || { echo "install-deps: pjdfstest is missing after installing it" >&2; exit 1; }
fi
