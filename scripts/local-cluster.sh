#!/usr/bin/env bash
# A one-node SLURM cluster with accounting, and an MLflow tracking server on PostgreSQL, on this
# machine: for trying the cluster path (profiles/slurm-local) before a real cluster.
#
#   scripts/local-cluster.sh start    install what is missing (Debian packages), write the
#                                     configuration, start every service; idempotent
#   scripts/local-cluster.sh stop [NAME...]  end exactly the processes `start` began (by their
#                                     PIDs), or only the named ones; `start` brings them back
#   scripts/local-cluster.sh status   which of them run; exit 0 only when all do
#
# Services (each binds to 127.0.0.1 or this host's own name, each started by this script in its
# own session so `stop` can end it and its children by its PID):
#   munged                   authentication between the SLURM daemons and the client tools
#   mariadbd   :$DB_PORT     the accounting database (own data folder, not the system's)
#   slurmdbd   :6819         accounting: `sacct`, which the Snakemake SLURM plugin reads
#   slurmctld  :6817         the controller;  slurmd :6818, the node daemon (this host, all CPUs)
#   postgres   :$PG_PORT     MLflow's backend store (own data folder, owned by `postgres`)
#   mlflow     :$MLFLOW_PORT the tracking server; artifacts in $STATE/mlartifacts (served by it)
#
# Must run as root (the SLURM daemons run as root here: SlurmUser=root). Needs Debian or Ubuntu
# (apt-get) the first time. Writes /etc/slurm/slurm.conf and /etc/slurm/slurmdbd.conf (client
# tools read them there); it refuses to overwrite files it did not write. State, logs, data and
# PIDs live in $MEML_CLUSTER_STATE (default /var/tmp/meml-local-cluster).
set -euo pipefail

STATE=${MEML_CLUSTER_STATE:-/var/tmp/meml-local-cluster}
DB_PORT=${MEML_CLUSTER_DB_PORT:-13306}
PG_PORT=${MEML_CLUSTER_PG_PORT:-15432}
MLFLOW_PORT=${MEML_CLUSTER_MLFLOW_PORT:-15000}
CLUSTER=meml-local
ACCOUNT=meml
PARTITION=meml-cpu
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${MEML_PYTHON:-$HERE/.venv/bin/python}
MARK="# written by meml scripts/local-cluster.sh"
PACKAGES=(munge slurmctld slurmd slurmdbd slurm-client mariadb-server postgresql-15)
PG_BIN=/usr/lib/postgresql/15/bin
SERVICES=(munged mariadbd slurmdbd slurmctld slurmd postgres mlflow)
HOST=$(hostname)

say() { echo "[local-cluster] $*"; }
die() { echo "[local-cluster] error: $*" >&2; exit 1; }

pid_of() { [[ -f $STATE/run/$1.pid ]] && cat "$STATE/run/$1.pid" || true; }
alive() { local pid; pid=$(pid_of "$1"); [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; }

# run NAME CMD...: start CMD in its own session, in the foreground mode of the daemon, and keep
# its PID (the session leader's, so `stop` ends it and any children it forked).
run() {
  local name=$1; shift
  if alive "$name"; then say "$name runs (pid $(pid_of "$name"))"; return; fi
  setsid "$@" >>"$STATE/log/$name.log" 2>&1 < /dev/null &
  echo $! >"$STATE/run/$name.pid"
  say "$name started (pid $!, log $STATE/log/$name.log)"
}

# wait_for WHAT SECONDS CMD...: until CMD succeeds, or fail naming WHAT and its log.
wait_for() {
  local what=$1 limit=$2; shift 2
  for ((i = 0; i < limit * 4; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if ! alive "$what"; then die "$what exited while starting; see $STATE/log/$what.log: $(tail -n 3 "$STATE/log/$what.log" 2>/dev/null | tr '\n' ' ')"; fi
    sleep 0.25
  done
  die "$what did not become ready in ${limit}s; see $STATE/log/$what.log"
}

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  ((${#missing[@]} == 0)) && return
  # exit status 3: the packages cannot be had here (the test suite skips on it, saying why)
  command -v apt-get >/dev/null || { echo "[local-cluster] missing Debian packages (${missing[*]}) and no apt-get here" >&2; exit 3; }
  say "installing ${missing[*]} (apt-get)"
  # no daemon starts from the packages' own scripts: this script starts its own
  local ok=1 own=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && own=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || ok=0
  ((own)) && rm -f /usr/sbin/policy-rc.d
  ((ok)) || { echo "[local-cluster] apt-get could not install ${missing[*]}" >&2; exit 3; }
}

# write_conf PATH: stdin to PATH, unless PATH exists and this script did not write it.
write_conf() {
  if [[ -f $1 ]] && ! grep -qF "$MARK" "$1"; then
    die "$1 exists and was not written by this script; move it aside to use the local cluster"
  fi
  { echo "$MARK"; cat; } >"$1"
}

configure() {
  mkdir -p "$STATE"/{run,log,slurmctld,slurmd,mlartifacts} /etc/slurm
  chmod 755 "$STATE"
  local cpus mem
  cpus=$(nproc)
  mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)  # leave a fifth to the host
  write_conf /etc/slurm/slurm.conf <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=$STATE/run/slurmctld.daemon.pid
SlurmdPidFile=$STATE/run/slurmd.daemon.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$HOST
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none
# sacct shows each job's --comment: the Snakemake plugin writes the rule and wildcards there
AccountingStoreFlags=job_comment
MinJobAge=300
SlurmdTimeout=60
InactiveLimit=0
KillWait=10
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
  if [[ ! -f $STATE/db.secret ]]; then
    (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$STATE/db.secret")
  fi
  write_conf /etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
DbdHost=$HOST
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$STATE/run/slurmdbd.daemon.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$(cat "$STATE/db.secret")
StorageLoc=slurm_acct_db
EOF
  chmod 600 /etc/slurm/slurmdbd.conf
}

start_munge() {
  [[ -f /etc/munge/munge.key ]] || /usr/sbin/mungekey --create --keyfile /etc/munge/munge.key
  mkdir -p /run/munge
  run munged /usr/sbin/munged --foreground --force --key-file /etc/munge/munge.key \
    --socket /run/munge/munge.socket.2 --pid-file "$STATE/run/munged.daemon.pid" \
    --seed-file "$STATE/munge.seed" --log-file "$STATE/log/munged.log"
  wait_for munged 20 bash -c 'munge -n | unmunge'
}

start_mariadb() {
  local data=$STATE/mariadb sock=$STATE/run/mariadb.sock
  if [[ ! -d $data/mysql ]]; then
    mariadb-install-db --datadir="$data" --user=root --auth-root-authentication-method=socket \
      --skip-test-db >>"$STATE/log/mariadbd.log" 2>&1
  fi
  run mariadbd /usr/sbin/mariadbd --no-defaults --datadir="$data" --user=root --bind-address=127.0.0.1 \
    --port="$DB_PORT" --socket="$sock" --pid-file="$STATE/run/mariadbd.daemon.pid" \
    --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 --log-error="$STATE/log/mariadbd.log"
  wait_for mariadbd 60 mariadb --no-defaults --socket="$sock" -u root -e 'select 1'
  local secret
  secret=$(cat "$STATE/db.secret")
  mariadb --no-defaults --socket="$sock" -u root <<EOF
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$secret';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$secret';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
EOF
}

start_slurm() {
  run slurmdbd /usr/sbin/slurmdbd -D
  wait_for slurmdbd 60 sacctmgr -n list cluster
  # the cluster, an account and this user in it: the SLURM plugin checks `-A <account>` against
  # `sacctmgr list user`, and sacct reports jobs by association
  # (each list read whole first: `grep -q` closing the pipe early fails it under pipefail)
  grep -qw "$CLUSTER" <<<"$(sacctmgr -n list cluster format=cluster%40)" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
  grep -qw "$ACCOUNT" <<<"$(sacctmgr -n list account format=account%40)" \
    || sacctmgr -i add account "$ACCOUNT" Cluster="$CLUSTER" Description="MEML-GRPO local cluster" Organization=meml >/dev/null
  grep -qw "$ACCOUNT" <<<"$(sacctmgr -n -s list user "$(id -un)" format=account%40)" \
    || sacctmgr -i add user "$(id -un)" Account="$ACCOUNT" Cluster="$CLUSTER" >/dev/null
  run slurmctld /usr/sbin/slurmctld -D
  wait_for slurmctld 60 scontrol ping
  run slurmd /usr/sbin/slurmd -D
  wait_for slurmd 60 bash -c "sinfo -h -n '$HOST' -o %t | grep -Eq '^(idle|mix|alloc)'"
}

start_postgres() {
  local data=$STATE/pgdata
  if [[ ! -f $STATE/pg.secret ]]; then
    (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$STATE/pg.secret")
  fi
  mkdir -p "$STATE/run/pg"
  chown postgres:postgres "$STATE/run/pg"
  if [[ ! -f $data/PG_VERSION ]]; then
    install -d -o postgres -g postgres -m 700 "$data"
    install -o postgres -m 600 "$STATE/pg.secret" "$STATE/run/pg/pwfile"
    runuser -u postgres -- "$PG_BIN/initdb" -D "$data" -U mlflow --pwfile="$STATE/run/pg/pwfile" \
      --auth-local=scram-sha-256 --auth-host=scram-sha-256 >>"$STATE/log/postgres.log" 2>&1
    rm -f "$STATE/run/pg/pwfile"
  fi
  run postgres runuser -u postgres -- "$PG_BIN/postgres" -D "$data" -p "$PG_PORT" \
    -c listen_addresses=127.0.0.1 -c unix_socket_directories="$STATE/run/pg" -c max_connections=200
  wait_for postgres 60 "$PG_BIN/pg_isready" -h 127.0.0.1 -p "$PG_PORT"
  export PGPASSWORD
  PGPASSWORD=$(cat "$STATE/pg.secret")
  grep -q 1 <<<"$(psql -h 127.0.0.1 -p "$PG_PORT" -U mlflow -d postgres -tAc "select 1 from pg_database where datname='mlflow'")" \
    || psql -h 127.0.0.1 -p "$PG_PORT" -U mlflow -d postgres -qc "create database mlflow" >/dev/null
}

start_mlflow() {
  [[ -x $PYTHON ]] || die "no Python at $PYTHON (set MEML_PYTHON to the project's venv python)"
  "$PYTHON" -c 'import psycopg2' 2>/dev/null \
    || die "psycopg2 is missing in $PYTHON: pip install -e '.[cluster]' (MLflow's PostgreSQL driver)"
  # The password stays off the command line (which `ps` shows every user): the URI names no
  # password, and libpq, under psycopg2, reads it from the password file PGPASSFILE names.
  (umask 077; printf '127.0.0.1:%s:mlflow:mlflow:%s\n' "$PG_PORT" "$(cat "$STATE/pg.secret")" >"$STATE/pgpass")
  PGPASSFILE=$STATE/pgpass run mlflow "$PYTHON" -m mlflow server \
    --backend-store-uri "postgresql://mlflow@127.0.0.1:$PG_PORT/mlflow" \
    --artifacts-destination "$STATE/mlartifacts" --host 127.0.0.1 --port "$MLFLOW_PORT" --workers 2
  wait_for mlflow 180 "$PYTHON" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$MLFLOW_PORT/health', timeout=2)"
}

start() {
  [[ $(id -u) == 0 ]] || die "run as root (the local cluster's daemons run as root)"
  install_packages
  configure
  start_munge
  start_mariadb
  start_slurm
  start_postgres
  start_mlflow
  say "ready: partition $PARTITION, account $ACCOUNT, MLflow http://127.0.0.1:$MLFLOW_PORT"
}

# stop [NAME...]: the named services (default: all, in reverse order of starting)
stop() {
  local i name pid only=" $* "
  for ((i = ${#SERVICES[@]} - 1; i >= 0; i--)); do
    name=${SERVICES[i]}
    [[ $# -gt 0 && $only != *" $name "* ]] && continue
    pid=$(pid_of "$name")
    [[ -z $pid ]] && continue
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      for ((t = 0; t < 120; t++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      if kill -0 "$pid" 2>/dev/null; then kill -KILL -- "-$pid" 2>/dev/null || true; fi
      say "$name stopped (pid $pid)"
    fi
    rm -f "$STATE/run/$name.pid"
  done
}

status() {
  local name down=0
  for name in "${SERVICES[@]}"; do
    if alive "$name"; then say "$name: running (pid $(pid_of "$name"))"; else say "$name: not running"; down=1; fi
  done
  if alive slurmctld; then sinfo -h -o "[local-cluster] partition %P: %D node(s) %t, %c CPUs" || true; fi
  if alive mlflow; then say "MLflow: http://127.0.0.1:$MLFLOW_PORT"; fi
  return $down
}

case ${1:-} in
  start) start ;;
  stop) shift; stop "$@" ;;
  status) status ;;
  *) echo "usage: $0 start | stop [${SERVICES[*]}] | status" >&2; exit 2 ;;
esac
