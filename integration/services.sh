#!/usr/bin/env bash
# Private test services on free loopback ports, data under DIR:
#   Redis 7 (password), PostgreSQL 15 (scram password), Ceph RGW (S3; 1 mon + 1 memstore OSD).
# usage: services.sh up DIR     -> starts them, writes DIR/env (source it)
#        services.sh down DIR   -> stops what DIR/*.pid names (by PID), removes nothing else
#        (a later `up DIR` removes the previous run's data there first)
# Every step fails loudly: a service that cannot start is an error, never a skip.
set -euo pipefail
cmd=${1:?usage: services.sh up|down DIR}; D=${2:?usage: services.sh up|down DIR}
PG=/usr/lib/postgresql/15/bin

freeport() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
wait_for() { # wait_for SECONDS DESCRIPTION CMD... (WAIT_PIDFILE: fail at once if that daemon died)
  local t=$1 what=$2; shift 2
  local end=$((SECONDS + t))
  while [ $SECONDS -lt $end ]; do
    "$@" >/dev/null 2>&1 && return 0
    if [ -n "${WAIT_PIDFILE:-}" ] && ! kill -0 "$(cat "$WAIT_PIDFILE")" 2>/dev/null; then
      echo "services.sh: $what exited while starting; logs in $D" >&2; return 1
    fi
    sleep 0.1
  done
  echo "services.sh: $what did not come up within ${t}s; logs in $D" >&2; return 1
}

down() {
  [ -d "$D" ] || return 0
  if [ -f "$D/pg/data/postmaster.pid" ]; then
    runuser -u postgres -- $PG/pg_ctl -D "$D/pg/data" -m immediate stop >/dev/null 2>&1 || true
  fi
  for f in "$D"/*.pid; do
    [ -f "$f" ] || continue
    pid=$(head -1 "$f"); [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  done
  sleep 0.5
  for f in "$D"/*.pid; do
    [ -f "$f" ] || continue
    pid=$(head -1 "$f"); [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
    rm -f "$f"
  done
}

# A directory used before: refused while its services run (checked before `up`'s ERR trap,
# which would stop them); else the previous run's data goes (only what this script made
# there), so that `up` works again after `down`.
reuse() {
  for f in "$D"/*.pid "$D/pg/data/postmaster.pid"; do
    [ -f "$f" ] || continue
    if kill -0 "$(head -1 "$f")" 2>/dev/null; then
      echo "services.sh: services in $D are running already ($(basename "$f" .pid)): source $D/env, or run: bash integration/services.sh down $D" >&2
      exit 1
    fi
  done
  rm -rf "$D/redis" "$D/pg" "$D/ceph" "$D/env" "$D"/*.pid
}

up() {
  mkdir -p "$D"; chmod 755 "$D"
  runuser -u postgres -- test -x "$D" || { echo "services.sh: the postgres user cannot enter $D (a parent directory is private): use a directory under /tmp" >&2; return 1; }
  PW=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
  S3_AK=JFSTEST$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F)
  S3_SK=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')

  # --- Redis (password in a config file, not on the command line) ---
  RPORT=$(freeport); mkdir -p "$D/redis"
  cat > "$D/redis/redis.conf" <<CONF
bind 127.0.0.1
port $RPORT
dir $D/redis
save ""
appendonly no
daemonize yes
pidfile $D/redis.pid
logfile $D/redis/redis.log
requirepass $PW
CONF
  chmod 600 "$D/redis/redis.conf"
  redis-server "$D/redis/redis.conf"
  wait_for 10 Redis sh -c "REDISCLI_AUTH='$PW' redis-cli -p $RPORT ping | grep -q PONG"

  # --- PostgreSQL (initdb refuses root; scram password for TCP clients) ---
  PPORT=$(freeport); mkdir -p "$D/pg"; chown postgres:postgres "$D/pg"
  printf '%s\n' "$PW" > "$D/pg/pw"; chown postgres "$D/pg/pw"; chmod 600 "$D/pg/pw"
  runuser -u postgres -- $PG/initdb -D "$D/pg/data" -U postgres --pwfile="$D/pg/pw" \
    --auth-host=scram-sha-256 --auth-local=trust -E UTF8 --no-sync >"$D/pg/initdb.log"
  runuser -u postgres -- $PG/pg_ctl -D "$D/pg/data" -l "$D/pg/pg.log" -w start -o \
    "-p $PPORT -k $D/pg -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" >/dev/null
  PGPASSWORD=$PW psql -h 127.0.0.1 -p $PPORT -U postgres -qc 'create database jfs' >/dev/null

  # --- Ceph RGW: one monitor, one memstore OSD, radosgw; cephx off ---
  C=$D/ceph; mkdir -p $C/{mon,osd,run,log,rgw}
  RGW_PORT=$(freeport); MON_V2=$(freeport); MON_V1=$(freeport)
  FSID=$(uuidgen)
  cat > $C/ceph.conf <<CONF
[global]
fsid = $FSID
mon_host = [v2:127.0.0.1:$MON_V2,v1:127.0.0.1:$MON_V1]
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
keyring = $C/keyring
run_dir = $C/run
admin_socket = $C/run/\$name.asok
pid_file = $C/run/\$name.pid
log_file = $C/log/\$name.log
mon_data = $C/mon/\$name
osd_data = $C/osd/\$name
osd_objectstore = memstore
memstore_device_bytes = 6442450944
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_max_pg_per_osd = 1000
osd_crush_chooseleaf_type = 0
mon_warn_on_pool_no_redundancy = false
mon_data_avail_warn = 2
# A test cluster on a large, busy disk: refuse to start only when almost nothing is left.
mon_data_avail_crit = 1
[client.rgw.jfs]
# radosgw insists on ms_mon_client_mode=secure, impossible with auth=none: allow crc too
ms_mon_client_mode = crc secure
rgw_frontends = beast endpoint=127.0.0.1:$RGW_PORT
rgw_data = $C/rgw
CONF
  local CC="ceph -c $C/ceph.conf"
  ceph-authtool --create-keyring $C/keyring --gen-key -n mon. --cap mon 'allow *' >/dev/null
  monmaptool --create --fsid $FSID --addv a "[v2:127.0.0.1:$MON_V2,v1:127.0.0.1:$MON_V1]" $C/monmap >/dev/null
  ceph-mon -c $C/ceph.conf --mkfs -i a --monmap $C/monmap --keyring $C/keyring
  # Seen once: the monitor exiting silently right after its mkfs. Start it again once.
  local ok=""
  for _ in 1 2; do
    ceph-mon -c $C/ceph.conf -i a -f >>$C/log/mon.out 2>&1 & echo $! > "$D/ceph-mon.pid"
    if WAIT_PIDFILE="$D/ceph-mon.pid" wait_for 30 "ceph monitor" timeout 5 $CC mon stat; then ok=1; break; fi
  done
  [ -n "$ok" ] || { tail -20 $C/log/mon.a.log >&2 || true; return 1; }
  UUID=$(uuidgen); ID=$($CC osd new $UUID)
  mkdir -p $C/osd/osd.$ID
  ceph-osd -c $C/ceph.conf -i $ID --mkfs --osd-uuid $UUID >$C/log/osd-mkfs.out 2>&1
  ceph-osd -c $C/ceph.conf -i $ID -f >$C/log/osd.out 2>&1 & echo $! > "$D/ceph-osd.pid"
  wait_for 60 "ceph osd" sh -c "$CC osd stat 2>/dev/null | grep -q '1 up'"
  radosgw -c $C/ceph.conf -n client.rgw.jfs -f >$C/log/rgw.out 2>&1 & echo $! > "$D/ceph-rgw.pid"
  wait_for 60 radosgw curl -s -o /dev/null http://127.0.0.1:$RGW_PORT/
  radosgw-admin -c $C/ceph.conf user create --uid=jfs --display-name=jfs --access-key="$S3_AK" --secret-key="$S3_SK" >/dev/null
  # The first bucket creation takes a few seconds (pool creation): do it here, and check it.
  for _ in $(seq 1 30); do
    code=$(curl -s -o /dev/null -w '%{http_code}' --aws-sigv4 "aws:amz:us-east-1:s3" --user "$S3_AK:$S3_SK" \
      -H 'x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855' -X PUT "http://127.0.0.1:$RGW_PORT/jfs-test")
    [ "$code" = 200 ] && break; sleep 1
  done
  [ "${code:-}" = 200 ] || { echo "services.sh: creating the S3 test bucket failed (HTTP $code)" >&2; return 1; }
  code=$(curl -s -o /dev/null -w '%{http_code}' --aws-sigv4 "aws:amz:us-east-1:s3" --user "$S3_AK:$S3_SK" \
      -H 'x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855' -X PUT "http://127.0.0.1:$RGW_PORT/jfs-test2")
  [ "$code" = 200 ] || { echo "services.sh: creating the second S3 test bucket failed (HTTP $code)" >&2; return 1; }

  cat > "$D/env" <<ENV
export JFS_TEST_REDIS=redis://127.0.0.1:$RPORT/0
export JFS_TEST_PG=postgres://postgres@127.0.0.1:$PPORT/jfs
export JFS_TEST_S3='s3://jfs-test?endpoint=http://127.0.0.1:$RGW_PORT'
export JFS_TEST_S3_ENDPOINT=http://127.0.0.1:$RGW_PORT
export JFS_TEST_S3B='s3://jfs-test2?endpoint=http://127.0.0.1:$RGW_PORT'
export JFS_META_PASSWORD='$PW'
export AWS_ACCESS_KEY_ID='$S3_AK'
export AWS_SECRET_ACCESS_KEY='$S3_SK'
export AWS_REGION=us-east-1
ENV
  chmod 600 "$D/env"
  echo "services up in $D: redis :$RPORT, postgres :$PPORT, s3 (ceph rgw) :$RGW_PORT"
}

case "$cmd" in
  up) reuse; [ -n "${JFS_SERVICES_KEEP_ON_ERROR:-}" ] || trap 'echo "services.sh: start failed; stopping what started" >&2; down' ERR; up ;;
  down) down ;;
  *) echo "usage: services.sh up|down DIR" >&2; exit 2 ;;
esac
