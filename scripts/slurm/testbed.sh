#!/usr/bin/env bash
# A local Slurm testbed: munged, slurmctld and N slurmd daemons (node1..nodeN) on this one machine,
# with every config, key, socket, pid file, spool directory, state file and log under one directory.
#
#   testbed.sh install          apt-get install slurm-wlm munge mpich when missing (needs root)
#   testbed.sh start  [DIR]     write the config under DIR, start the daemons, wait until all nodes are idle
#   testbed.sh stop   [DIR]     cancel every job, stop every daemon started from DIR, verify none survives
#   testbed.sh status [DIR]     daemons, sinfo and squeue; exit 0 when running, 3 when not
#
# DIR defaults to $PWD/.slurm-testbed. Clients use it with `source DIR/env.sh` (sets SLURM_CONF).
# Environment: SLURM_TESTBED_NODES (default 4), SLURM_TESTBED_CPUS (CPUs per node, default nproc),
# SLURM_TESTBED_TIMEOUT (seconds to wait for idle nodes, default 60),
# SLURM_TESTBED_KEEP_ON_FAILURE=1 (leave the daemons of a failed start running, for debugging).
# See README.md beside this file.
set -euo pipefail

PROG=testbed.sh
NODES=${SLURM_TESTBED_NODES:-4}
CPUS=${SLURM_TESTBED_CPUS:-$(nproc)}
START_TIMEOUT=${SLURM_TESTBED_TIMEOUT:-60}
STOP_TIMEOUT=10        # seconds between SIGTERM and SIGKILL
FAILED_DIR=
FAIL_REASON="a command failed"
PACKAGES=(slurm-wlm munge mpich)
COMMANDS=(munged munge unmunge slurmctld slurmd srun sbatch scancel squeue sinfo scontrol)

# The daemons live in /usr/sbin, which a non-root PATH often lacks.
PATH=$PATH:/usr/sbin:/sbin

# Slurm clients and daemons read SLURM_* from the environment (SLURM_CONF above all); a caller
# inside a real job, or one that sourced another testbed's env.sh, must not leak into this one.
while IFS= read -r var; do
    case $var in SLURM_TESTBED_*) ;; *) unset "$var" ;; esac
done < <(compgen -e | grep '^SLURM' || true)

say() { printf '%s: %s\n' "$PROG" "$*"; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

usage() {
    sed -n '2,14s/^# \{0,1\}//p' "$0"
    exit "${1:-0}"
}

# --- paths -------------------------------------------------------------------------------------------

resolve_dir() {
    local dir=${1:-$PWD/.slurm-testbed}
    dir=$(realpath -m -- "$dir")
    # slurm.conf has no quoting, '%' is expanded in file names and '#' starts a comment.
    if [[ $dir =~ [[:space:]%#\"\'\\] ]]; then
        die "testbed directory '$dir' must not contain blanks, quotes, backslashes, '%' or '#'"
    fi
    # A unix socket path is at most 107 bytes.
    if ((${#dir} > 80)); then
        die "testbed directory path is too long for a unix socket (keep it under ~80 characters): $dir"
    fi
    printf '%s\n' "$dir"
}

# --- processes ---------------------------------------------------------------------------------------

# The PIDs (one "pid name" a line) of every slurmctld, slurmd and munged whose command line names a file
# under DIR, and of every slurmstepd forked by such a slurmd (marked by SLURM_TESTBED_DIR in its environment).
# Zombies (exited, not yet reaped) have an empty command line and environment, so they are not listed.
testbed_pids() {
    local dir=$1 pid comm cmdline environ name pids=""
    for name in slurmctld slurmd munged slurmstepd; do   # (pgrep warns on a pattern over 15 characters)
        pids+=" $(pgrep -x "$name" || true)"
    done
    for pid in $pids; do
        comm=$(cat 2>/dev/null "/proc/$pid/comm") || continue
        if [[ $comm == slurmstepd ]]; then
            environ=$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ") || continue
            grep -qxF "SLURM_TESTBED_DIR=$dir" <<<"$environ" || continue
        else
            cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || continue
            # "$dir/" must start an argument (or follow --opt=): /tmp/tb must not match /home/u/tmp/tb
            [[ " $cmdline" == *[\ =]"$dir/"* ]] || continue
        fi
        printf '%s %s\n' "$pid" "$comm"
    done
}

# Job tasks left behind by a killed slurmstepd: processes of a job of this testbed (SLURM_JOB_ID set and
# SLURM_CONF pointing into DIR), except this script and its ancestors.
orphan_task_pids() {
    local dir=$1 pid environ self=" "
    pid=$$
    while [[ $pid =~ ^[0-9]+$ ]] && (( pid > 1 )); do
        self+="$pid "
        pid=$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || break
    done
    while IFS=/ read -r _ _ pid _; do
        [[ $self == *" $pid "* ]] && continue
        environ=$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ") || continue
        grep -q '^SLURM_JOB_ID=' <<<"$environ" || continue
        grep -qxF "SLURM_CONF=$dir/slurm.conf" <<<"$environ" || continue
        printf '%s task\n' "$pid"
    done < <(grep -lsF "SLURM_CONF=$dir/slurm.conf" /proc/[0-9]*/environ || true)
}

# The PID in pid file FILE when that process is alive and is a NAME started from DIR; else status 1.
pidfile_alive() {
    local file=$1 name=$2 dir=$3 pid pids
    [[ -s $file ]] || return 1
    pid=$(tr -dc '0-9' <"$file")
    [[ -n $pid ]] || return 1
    pids=$(testbed_pids "$dir")
    grep -qx "$pid $name" <<<"$pids" || return 1
    printf '%s\n' "$pid"
}

# Number of the expected daemons (munged, slurmctld, N x slurmd) alive, and whether all are.
running_count() {
    local dir=$1 nodes=$2 n=0 k
    pidfile_alive "$dir/run/munged.pid" munged "$dir" >/dev/null && n=$((n + 1))
    pidfile_alive "$dir/run/slurmctld.pid" slurmctld "$dir" >/dev/null && n=$((n + 1))
    for ((k = 1; k <= nodes; k++)); do
        pidfile_alive "$dir/run/slurmd-node$k.pid" slurmd "$dir" >/dev/null && n=$((n + 1))
    done
    printf '%s\n' "$n"
}

recorded_nodes() {
    local dir=$1
    if [[ -f $dir/testbed.state ]]; then
        sed -n 's/^nodes=//p' "$dir/testbed.state"
    else
        printf '%s\n' "$NODES"
    fi
}

log_tails() {
    local dir=$1 f
    for f in "$dir"/log/*.log "$dir"/log/*.out; do
        [[ -s $f ]] || continue
        printf '\n--- last lines of %s ---\n' "$f" >&2
        tail -n 15 "$f" >&2
    done
}

# --- install -----------------------------------------------------------------------------------------

missing_commands() {
    local c
    for c in "${COMMANDS[@]}"; do
        command -v "$c" >/dev/null 2>&1 || printf '%s\n' "$c"
    done | paste -sd ' ' -
}

cmd_install() {
    local missing pkg need_update=0 to_install=()
    for pkg in "${PACKAGES[@]}"; do
        if [[ $(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true) != installed ]]; then
            to_install+=("$pkg")
        fi
    done
    missing=$(missing_commands)
    if ((${#to_install[@]} == 0)) && [[ -z $missing ]]; then
        say "slurm-wlm, munge and mpich are already installed ($(slurmctld -V 2>/dev/null || true))"
        return 0
    fi
    if ((EUID != 0)); then
        if [[ -z $missing ]]; then
            say "Slurm and munge are installed; not root, so not installing: ${to_install[*]}"
            return 0
        fi
        die "Slurm is not installed (missing: $missing) and installing it needs root:" \
            "run 'sudo $0 install' or 'apt-get install ${PACKAGES[*]}' as root"
    fi
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found: install ${PACKAGES[*]} by hand"
    ((${#to_install[@]})) || to_install=("${PACKAGES[@]}")
    export DEBIAN_FRONTEND=noninteractive
    for pkg in "${to_install[@]}"; do
        if ! apt-cache show "$pkg" >/dev/null 2>&1; then need_update=1; fi
    done
    if ((need_update)); then
        say "apt-get update (a package is not in the local lists)"
        apt-get update -q >/dev/null || die "apt-get update failed"
    fi
    say "apt-get install ${to_install[*]}"
    apt-get install -y -q -o Dpkg::Use-Pty=0 "${to_install[@]}" >/dev/null ||
        die "apt-get install ${to_install[*]} failed"
    missing=$(missing_commands)
    [[ -z $missing ]] || die "still missing after apt-get install: $missing"
    say "installed: $(slurmctld -V)"
}

# --- start -------------------------------------------------------------------------------------------

# N+1 consecutive free TCP ports below the ephemeral range (so no outgoing connection takes one first),
# and below 27000: configs/slurm-local.yaml's database ranks listen from vdb.cluster.base_port 27000 on the
# same loopback host (a slurmd drawn on 27000-27003 made every rank fail to bind).
free_ports() {
    local count=$1 lo=20000 hi=26990 used base p tries ok
    read -r p _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null && ((p > lo + 1000 && p - 1 < hi)) && hi=$((p - 1))
    used=" $(ss -Htan 2>/dev/null | awk '{n = split($4, a, ":"); printf "%s ", a[n]}') "
    for ((tries = 0; tries < 100; tries++)); do
        base=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo - count)))
        ok=1
        for ((p = base; p < base + count; p++)); do
            if [[ $used == *" $p "* ]]; then ok=0; break; fi
        done
        if ((ok)); then printf '%s\n' "$base"; return 0; fi
    done
    die "found no $count consecutive free TCP ports in $lo-$hi"
}

write_config() {
    local dir=$1 base=$2 host=$3 mem=$4 user addr bind
    user=$(id -un)
    local ctld_port=$base first=$((base + 1)) last=$((base + NODES))
    # With NoCtldInAddrAny/NoInAddrAny, slurmctld, slurmd and srun bind to the address gethostname()
    # resolves to instead of 0.0.0.0. That is safe only when the name resolves to a loopback address,
    # which is then the one every daemon is reached at; otherwise they keep binding to 0.0.0.0.
    addr=$(getent ahostsv4 "$(hostname)" 2>/dev/null | awk 'NR == 1 {print $1}' || true)
    if [[ $addr == 127.* ]]; then
        bind="CommunicationParameters=NoCtldInAddrAny,NoInAddrAny"
    else
        say "note: $(hostname) resolves to '${addr:-nothing}', not a loopback address: the daemons listen on 0.0.0.0"
        addr=127.0.0.1 bind="#CommunicationParameters=NoCtldInAddrAny,NoInAddrAny  (hostname is not loopback)"
    fi
    cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm/testbed.sh on $(date -u +%FT%TZ); rewritten on every start, do not edit.
# $NODES nodes on this one machine: every slurmd shares its cores, file system and loopback.
ClusterName=testbed
SlurmctldHost=$host($addr)
SlurmctldPort=$ctld_port
SlurmUser=$user
SlurmdUser=$user
# Bind to the (loopback) address the host name resolves to instead of 0.0.0.0.
$bind
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmdSpoolDir=$dir/spool/%n
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Start a batch job about 1 s after submission instead of 3 s (batch_sched_delay) or 30 s (bf_interval).
SchedulerParameters=batch_sched_delay=0,bf_interval=1
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
# CPUs per node may exceed the real count: every node shares the same cores.
SlurmdParameters=config_overrides
ReturnToService=2
# Fast turnaround: SIGKILL 2 s after SIGTERM on scancel, forget finished jobs after 60 s.
KillWait=2
MinJobAge=60
InactiveLimit=0
MessageTimeout=10
SlurmdTimeout=120
NodeName=node[1-$NODES] NodeHostname=$host NodeAddr=$addr Port=[$first-$last] CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$mem State=UNKNOWN
# OverSubscribe=YES: jobs that ask for it (--oversubscribe) may share CPUs; others get their own.
PartitionName=debug Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
    : >"$dir/plugstack.conf"   # no SPANK plugins (the system's /etc/slurm/plugstack.conf is not read)
    cat >"$dir/env.sh" <<EOF
# source $dir/env.sh  -- points the Slurm clients (srun, sbatch, squeue, ...) at this testbed.
export SLURM_CONF=$dir/slurm.conf
EOF
    cat >"$dir/testbed.state" <<EOF
nodes=$NODES
cpus=$CPUS
slurmctld_port=$ctld_port
slurmd_ports=$first-$last
address=$addr
EOF
}

start_fail() { FAIL_REASON=$*; exit 1; }   # only after the EXIT trap below is set

start_failed() {
    local dir=$1
    trap - EXIT
    printf '%s: error: the testbed in %s did not start: %s (log lines below)\n' "$PROG" "$dir" "$FAIL_REASON" >&2
    if [[ -f $dir/slurm.conf ]] && pidfile_alive "$dir/run/slurmctld.pid" slurmctld "$dir" >/dev/null; then
        SLURM_CONF=$dir/slurm.conf timeout 10 sinfo -N -o '%N %T %E' >&2 2>&1 || true
    fi
    log_tails "$dir"
    if [[ ${SLURM_TESTBED_KEEP_ON_FAILURE:-0} == 1 ]]; then
        printf '%s: SLURM_TESTBED_KEEP_ON_FAILURE=1: leaving the daemons running; run %s stop %s\n' \
            "$PROG" "$0" "$dir" >&2
    else
        cmd_stop "$dir" >&2 || true
    fi
    exit 1
}

cmd_start() {
    local dir host mem n nodes t0 deadline idle k missing base
    t0=$(date +%s.%N)
    dir=$(resolve_dir "${1:-}")
    if ! [[ $NODES =~ ^[1-9][0-9]*$ ]] || ((NODES > 64)); then
        die "SLURM_TESTBED_NODES must be 1..64, not '$NODES'"
    fi
    [[ $CPUS =~ ^[1-9][0-9]*$ ]] || die "SLURM_TESTBED_CPUS must be a positive integer, not '$CPUS'"
    missing=$(missing_commands)
    if [[ -n $missing ]]; then
        die "Slurm is not installed (missing: $missing); run '$0 install' as root first"
    fi
    if ((EUID != 0)); then
        say "warning: not root: the daemons run as $(id -un) and only $(id -un)'s jobs can run"
    fi

    nodes=$(recorded_nodes "$dir")
    n=$(running_count "$dir" "$nodes")
    if ((n == nodes + 2)) && [[ -f $dir/env.sh ]]; then
        say "already running from $dir ($nodes nodes); use: source $dir/env.sh"
        ((nodes == NODES)) || say "warning: it has $nodes nodes, not SLURM_TESTBED_NODES=$NODES; stop it first to change"
        return 0
    fi
    if [[ -n $(testbed_pids "$dir") ]]; then
        say "a partial testbed is running from $dir; stopping it first"
        cmd_stop "$dir"
    fi

    if [[ -d $dir && ! -f $dir/testbed.state ]] && [[ -n $(ls -A "$dir") ]]; then
        die "$dir is not empty and is not a testbed directory (no testbed.state): choose another"
    fi
    mkdir -p "$dir"
    # Fresh state, spool, pid files and logs on every start; the munge key is kept.
    rm -rf "$dir/state" "$dir/spool" "$dir/run" "$dir/log"
    mkdir -p "$dir/state" "$dir/run" "$dir/log" "$dir/munge"
    for ((k = 1; k <= NODES; k++)); do mkdir -p "$dir/spool/node$k"; done
    chmod 700 "$dir/munge"

    host=$(hostname -s)
    mem=$(awk -v n="$NODES" '/^MemTotal:/ {m = int($2 / 1024 / n); print (m > 1 ? m : 1)}' /proc/meminfo)
    base=$(free_ports $((NODES + 1)))
    write_config "$dir" "$base" "$host" "$mem"

    FAILED_DIR=$dir
    trap 'start_failed "$FAILED_DIR"' EXIT

    # munged, with its key, socket, pid, seed and log under DIR rather than /etc/munge, /run/munge,
    # /var/lib/munge and /var/log/munge. --force is needed because munged wants every directory above its
    # socket to be searchable by all users (DIR may sit under a private directory such as pytest's tmp dir);
    # it turns that error into a warning. Only the owner of DIR can then use the socket, which is what a
    # one-user testbed wants. The daemons reach this socket through AuthInfo=socket=... in slurm.conf.
    if [[ ! -s $dir/munge/munge.key ]]; then
        (umask 077 && dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none)
    fi
    chmod 400 "$dir/munge/munge.key"
    munged --force --num-threads=2 \
        --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/run/munged.pid" --seed-file="$dir/munge/munged.seed" \
        --log-file="$dir/log/munged.log" </dev/null >>"$dir/log/munged.out" 2>&1 ||
        start_fail "munged exited with status $?"
    for ((k = 0; k < 50; k++)); do
        if munge -n -S "$dir/munge/munge.socket" 2>/dev/null | unmunge -S "$dir/munge/munge.socket" >/dev/null 2>&1; then
            break
        fi
        sleep 0.1
    done
    ((k < 50)) || start_fail "munged does not answer on $dir/munge/munge.socket after 5s"

    # The daemons get a clean environment: SLURM_CONF for their own children, SLURM_TESTBED_DIR so that
    # `stop` can recognise the slurmstepd processes they fork (whose command line names no file).
    local -a denv=(env "SLURM_CONF=$dir/slurm.conf" "SLURM_TESTBED_DIR=$dir")
    # -c: start from clean state (no jobs or node states of an earlier run).
    "${denv[@]}" slurmctld -c -f "$dir/slurm.conf" </dev/null >>"$dir/log/slurmctld.out" 2>&1 ||
        start_fail "slurmctld exited with status $?"
    for ((k = 1; k <= NODES; k++)); do
        "${denv[@]}" slurmd -c -f "$dir/slurm.conf" -N "node$k" </dev/null >>"$dir/log/slurmd-node$k.out" 2>&1 ||
            start_fail "slurmd -N node$k exited with status $?"
    done

    export SLURM_CONF=$dir/slurm.conf
    deadline=$(($(date +%s) + START_TIMEOUT))
    while :; do
        idle=$(timeout 10 sinfo -h -N -p debug -t idle -o '%N' 2>/dev/null | sort -u | grep -c . || true)
        ((idle >= NODES)) && break
        if (($(date +%s) >= deadline)); then
            start_fail "only $idle of $NODES nodes idle after ${START_TIMEOUT}s (SLURM_TESTBED_TIMEOUT)"
        fi
        n=$(running_count "$dir" "$NODES")
        if ((n < NODES + 2)) && [[ -s $dir/run/slurmctld.pid ]]; then
            sleep 1   # a daemon may still be writing its pid file; look once more before giving up
            n=$(running_count "$dir" "$NODES")
            if ((n < NODES + 2)); then
                start_fail "only $n of $((NODES + 2)) daemons (munged, slurmctld, $NODES x slurmd) are alive"
            fi
        fi
        sleep 0.3
    done
    trap - EXIT
    say "running from $dir: $NODES nodes (CPUs=$CPUS each), slurmctld on $(sed -n 's/^address=//p' "$dir/testbed.state"):$(sed -n 's/^slurmctld_port=//p' "$dir/testbed.state"), slurmd ports $(sed -n 's/^slurmd_ports=//p' "$dir/testbed.state"), up in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')s"
    say "use it with: source $dir/env.sh; srun -N$((NODES < 3 ? NODES : 3)) -l printenv SLURMD_NODENAME"
}

# --- stop --------------------------------------------------------------------------------------------

# Send SIG to the pid of each "pid name" line on stdin.
signal_all() {
    local sig=$1 pid name
    while read -r pid name; do
        [[ -n $pid ]] || continue
        kill "-$sig" "$pid" 2>/dev/null || true
    done
}

wait_gone() {   # wait up to SECONDS for the testbed's daemons to exit; prints what is left
    local dir=$1 seconds=$2 left deadline
    deadline=$(($(date +%s) + seconds))
    while :; do
        left=$(testbed_pids "$dir")
        [[ -z $left ]] && return 0
        (($(date +%s) >= deadline)) && { printf '%s\n' "$left"; return 1; }
        sleep 0.2
    done
}

# munged goes last, once the Slurm daemons (which talk through it while shutting down) are gone.
wait_gone_but_munged() {   # like wait_gone, for all but munged
    local dir=$1 seconds=$2 left deadline
    deadline=$(($(date +%s) + seconds))
    while :; do
        left=$(testbed_pids "$dir" | grep -v ' munged$' || true)
        [[ -z $left ]] && return 0
        (($(date +%s) >= deadline)) && { printf '%s\n' "$left"; return 1; }
        sleep 0.2
    done
}

cmd_stop() {
    local dir jobs left tasks pid k file name
    dir=$(resolve_dir "${1:-}")
    if [[ -z $(testbed_pids "$dir") ]]; then
        tasks=$(orphan_task_pids "$dir")
        [[ -z $tasks ]] || signal_all KILL <<<"$tasks"
        say "not running from $dir"
        return 0
    fi

    # 1. Cancel every job while slurmctld and the slurmd still run, so their slurmstepd end the tasks.
    if pidfile_alive "$dir/run/slurmctld.pid" slurmctld "$dir" >/dev/null; then
        export SLURM_CONF=$dir/slurm.conf
        jobs=$(timeout 10 squeue -h -o '%A' 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            say "cancelling jobs: $(tr '\n' ' ' <<<"$jobs")"
            # shellcheck disable=SC2086  # one job id a word
            timeout 10 scancel $jobs 2>/dev/null || true
            for ((k = 0; k < 50; k++)); do
                [[ -z $(timeout 5 squeue -h -o '%A' 2>/dev/null || true) ]] && break
                sleep 0.2
            done
        fi
    fi

    # 2. SIGTERM the slurmd and slurmctld by their pid files, and anything else of DIR but munged (a daemon
    #    whose pid file is missing, a slurmstepd); once they are gone (or after STOP_TIMEOUT), munged too.
    for file in "$dir"/run/slurmd-*.pid "$dir/run/slurmctld.pid"; do
        name=$(basename "$file" .pid)
        pid=$(pidfile_alive "$file" "${name%%-*}" "$dir") || continue
        kill -TERM "$pid" 2>/dev/null || true
    done
    testbed_pids "$dir" | { grep -v ' munged$' || true; } | signal_all TERM
    left=$(wait_gone_but_munged "$dir" "$STOP_TIMEOUT") || {
        say "still alive after SIGTERM and ${STOP_TIMEOUT}s, sending SIGKILL: $(tr '\n' ' ' <<<"$left")"
        signal_all KILL <<<"$left"
    }
    testbed_pids "$dir" | signal_all TERM
    left=$(wait_gone "$dir" "$STOP_TIMEOUT") || {
        say "still alive after SIGTERM and ${STOP_TIMEOUT}s, sending SIGKILL: $(tr '\n' ' ' <<<"$left")"
        signal_all KILL <<<"$left"
    }
    tasks=$(orphan_task_pids "$dir")
    [[ -z $tasks ]] || { say "killing leftover job tasks: $(tr '\n' ' ' <<<"$tasks")"; signal_all KILL <<<"$tasks"; }

    # 3. Verify.
    if left=$(wait_gone "$dir" 3); then
        rm -f "$dir"/run/*.pid
        say "stopped (logs kept in $dir/log)"
        return 0
    fi
    printf '%s: error: still alive after SIGKILL:\n%s\n' "$PROG" "$left" >&2
    return 1
}

# --- status ------------------------------------------------------------------------------------------

cmd_status() {
    local dir nodes n
    dir=$(resolve_dir "${1:-}")
    nodes=$(recorded_nodes "$dir")
    n=$(running_count "$dir" "$nodes")
    say "$dir: $n of $((nodes + 2)) daemons alive (munged, slurmctld, $nodes x slurmd)"
    testbed_pids "$dir" | sed 's/^/  pid /'
    if ! pidfile_alive "$dir/run/slurmctld.pid" slurmctld "$dir" >/dev/null; then
        say "not running"
        return 3
    fi
    export SLURM_CONF=$dir/slurm.conf
    timeout 10 sinfo -N -o '%10N %10P %8T %5c %E' || true
    timeout 10 squeue -o '%8i %10P %15j %8u %3t %10M %6D %R' || true
    ((n == nodes + 2)) || return 3
}

main() {
    local cmd=${1:-}
    (($#)) && shift
    case $cmd in
        install) (($# == 0)) || usage 2; cmd_install ;;
        start) (($# <= 1)) || usage 2; cmd_start "$@" ;;
        stop) (($# <= 1)) || usage 2; cmd_stop "$@" ;;
        status) (($# <= 1)) || usage 2; cmd_status "$@" ;;
        -h | --help | help) usage 0 ;;
        *) printf '%s: unknown command "%s"\n\n' "$PROG" "$cmd" >&2; usage 2 >&2 ;;
    esac
}

main "$@"
