# Shared functions of the database ranks (apps/vdb/cluster/lib.sh, copied beside the rank scripts).
# A rank: finds its address, waits for rank 0 when it joins one, starts its container, waits until it is
# healthy, records every state in registry/rank-NNN.json, and stops its server when registry/STOP appears.

# This attempt's id: the scheduler's job id, so a retry never starts on a stale data directory.
VDB_JOB=${SLURM_JOB_ID:-${PBS_JOBID:-local-$PPID}}
VDB_JOB=${VDB_JOB//[^A-Za-z0-9._-]/_}

vdb_addr() {  # IPv4 address of interface $1, else the host's first address
  local a=""
  if [ -n "$1" ]; then
    a=$(ip -o -4 addr show dev "$1" 2>/dev/null | awk '{split($4, p, "/"); print p[1]; exit}')
  fi
  [ -n "$a" ] || a=$(hostname -i 2>/dev/null | awk '{print $1}')
  echo "${a:-127.0.0.1}"
}

vdb_register() {  # state: starting | up | ready | failed | stopped | orphaned
  local f="$VDB_REGISTRY/rank-$VDB_RANK_ID.json"
  printf '{"rank": %d, "database": "%s", "role": "%s", "host": "%s", "hostname": "%s", "node": "%s", ' \
    "$VDB_RANK" "$VDB_DATABASE" "$VDB_ROLE" "$VDB_ADDR" "$(hostname)" \
    "${SLURMD_NODENAME:-${PBS_NODENUM:-$(hostname)}}" > "$f.tmp.$$"
  printf '"ports": %s, "state": "%s", "pid": %s, "log": "%s", "time": %s}\n' \
    "$VDB_PORTS" "$1" "${VDB_PID:-null}" "$VDB_LOG" "$(date +%s)" >> "$f.tmp.$$"
  mv -f "$f.tmp.$$" "$f"  # atomic: readers never see half a file
}

vdb_http_ok() { curl --noproxy '*' -fsS -o /dev/null --max-time 3 "$1" 2>/dev/null; }
# Servers listen on this rank's interface address, not on every interface: probe the port there.
vdb_port_open() { (exec 3<>"/dev/tcp/$VDB_ADDR/$1") 2>/dev/null; }

vdb_wait_rank0() {  # sets VDB_RANK0_ADDR once rank 0 is up (or ready)
  local f="$VDB_REGISTRY/rank-000.json" deadline=$((SECONDS + VDB_TIMEOUT))
  until [ -f "$f" ] && grep -Eq '"state": "(up|ready)"' "$f"; do
    if [ -f "$VDB_REGISTRY/STOP" ] || [ $SECONDS -ge $deadline ]; then
      echo "rank $VDB_RANK: rank 0 did not come up within ${VDB_TIMEOUT}s" >&2; vdb_register failed; exit 1
    fi
    sleep 2
  done
  VDB_RANK0_ADDR=$(sed -n 's/.*"host": "\([^"]*\)".*/\1/p' "$f")
}

vdb_render() {  # template -> file, with this rank's and rank 0's addresses and the job id filled in
  sed -e "s|@VDB_ADDR@|$VDB_ADDR|g" -e "s|@VDB_RANK0_ADDR@|${VDB_RANK0_ADDR:-}|g" -e "s|@VDB_JOB@|$VDB_JOB|g" \
    "$1" > "$2"
}

vdb_orphaned() {  # true when the driver stopped renewing registry/LEASE (it died): stop, do not serve on
  local f="$VDB_REGISTRY/LEASE" age
  [ "${VDB_LEASE_S:-0}" -gt 0 ] && [ -f "$f" ] || return 1
  age=$(( $(date +%s) - $(stat -c %Y "$f" 2>/dev/null || date +%s) ))
  if [ "$age" -gt "$VDB_LEASE_S" ]; then
    echo "rank $VDB_RANK: the driver's lease is ${age}s old (limit ${VDB_LEASE_S}s); stopping" >&2
    return 0
  fi
  return 1
}

# Telemetry (vdb.cluster.telemetry): the rank script sets VDB_TELEMETRY (its Parquet file) and VDB_PYTHON.
vdb_telemetry_start() {  # sample the server (and its children) once a second, on the host, beside it
  [ -n "${VDB_TELEMETRY:-}" ] || return 0
  mkdir -p "$(dirname "$VDB_TELEMETRY")"
  "$VDB_PYTHON" -m apps.telemetry --pids "$VDB_PID" --out "$VDB_TELEMETRY" --interval 1 --rank "$VDB_RANK" \
    --node "${SLURMD_NODENAME:-${PBS_NODENUM:-$(hostname)}}" --while-alive $$ >> "$VDB_LOG" 2>&1 &
  VDB_TELEMETRY_PID=$!
}

vdb_telemetry_stop() {  # the sampler writes its file on SIGTERM (or once the server exited): wait for it
  [ -n "${VDB_TELEMETRY_PID:-}" ] || return 0
  kill -TERM "$VDB_TELEMETRY_PID" 2>/dev/null
  for _ in $(seq 1 30); do kill -0 "$VDB_TELEMETRY_PID" 2>/dev/null || break; sleep 1; done
  kill -KILL "$VDB_TELEMETRY_PID" 2>/dev/null
  VDB_TELEMETRY_PID=""
}

vdb_stop() {
  trap - TERM INT
  if [ -n "${VDB_PID:-}" ] && kill -0 "$VDB_PID" 2>/dev/null; then
    kill -TERM "$VDB_PID" 2>/dev/null
    for _ in $(seq 1 30); do kill -0 "$VDB_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL "$VDB_PID" 2>/dev/null
  fi
  vdb_telemetry_stop  # before "stopped": the driver merges the files once every rank says so
  vdb_register "${1:-stopped}"
  if [ "$VDB_CLEANUP" = 1 ]; then  # the rank's data, then the job, cluster and pes2o-vdb dirs once empty
    rm -rf "$VDB_DATA"
    local d="$VDB_DATA"
    for _ in 1 2 3; do d=$(dirname "$d"); rmdir "$d" 2>/dev/null || break; done
  fi
  exit "${2:-0}"
}

vdb_serve() {  # start "$@" in the background, wait until healthy, then until STOP or exit
  mkdir -p "$(dirname "$VDB_LOG")"
  case "$VDB_READY_URL" in  # a marker file left by an earlier start (a requeued job) never counts
    file://*) rm -f "${VDB_READY_URL#file://}" ;;
  esac
  "$@" >> "$VDB_LOG" 2>&1 &
  VDB_PID=$!
  trap 'vdb_stop stopped 0' TERM INT
  vdb_telemetry_start
  vdb_register starting
  local deadline=$((SECONDS + VDB_TIMEOUT)) up=0
  until vdb_http_ok "$VDB_READY_URL"; do
    if ! kill -0 "$VDB_PID" 2>/dev/null; then
      echo "rank $VDB_RANK: server exited while starting" >&2; vdb_stop failed 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      echo "rank $VDB_RANK: not healthy after ${VDB_TIMEOUT}s" >&2; vdb_stop failed 1
    fi
    [ -f "$VDB_REGISTRY/STOP" ] && vdb_stop stopped 0
    vdb_orphaned && vdb_stop orphaned 1
    if [ $up = 0 ] && [ -n "$VDB_UP_PORT" ] && vdb_port_open "$VDB_UP_PORT"; then up=1; vdb_register up; fi
    sleep 1
  done
  vdb_register ready
  while kill -0 "$VDB_PID" 2>/dev/null && [ ! -f "$VDB_REGISTRY/STOP" ]; do
    vdb_orphaned && vdb_stop orphaned 1
    sleep 2
  done
  if [ -f "$VDB_REGISTRY/STOP" ]; then vdb_stop stopped 0; fi
  echo "rank $VDB_RANK: server exited unexpectedly" >&2
  vdb_stop failed 1
}
