# submit: qsub  -q capacity -A MyProject /projects/MyProject/pes2o-ve/runs/<run-id>/parsl/000/submit_scripts/parsl.workers.block-0
#!/bin/bash

#PBS -S /bin/bash
#PBS -N parsl.workers.block-0
#PBS -m n
#PBS -l walltime=06:00:00
#PBS -l select=16:ncpus=208
#PBS -o /projects/MyProject/pes2o-ve/runs/<run-id>/parsl/000/submit_scripts/parsl.workers.block-0.stdout
#PBS -e /projects/MyProject/pes2o-ve/runs/<run-id>/parsl/000/submit_scripts/parsl.workers.block-0.stderr
#PBS -l filesystems=home:flare
#PBS -l place=scatter

module load frameworks
source /projects/MyProject/venv/bin/activate
export ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE
export PATH="<venv>/bin:$PATH"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

export JOBNAME="parsl.workers.block-0"

set -e
export CORES=$(getconf _NPROCESSORS_ONLN)
[[ "1" == "1" ]] && echo "Found cores : $CORES"
WORKERCOUNT=16
SCRIPT_DIR="/projects/MyProject/pes2o-ve/runs/<run-id>/parsl/000/submit_scripts"
[[ -d $SCRIPT_DIR ]] || SCRIPT_DIR=""

# Deduplicate the nodefile
HOSTFILE="$JOBNAME.nodes"
if [ -z "$PBS_NODEFILE" ]; then
    echo "localhost" > $HOSTFILE
else
    sort -u $PBS_NODEFILE > $HOSTFILE
fi

cat << MPIEXEC_EOF > ${SCRIPT_DIR:+$SCRIPT_DIR/}cmd_$JOBNAME.sh
process_worker_pool.py  --max_workers_per_node=12 -a <login-node-address> -p 0 -c 16.0 -m None --poll 10 --port=<interchange-worker-port> --cert_dir /projects/MyProject/pes2o-ve/runs/<run-id>/parsl/000/workers/certificates --logdir=/projects/MyProject/pes2o-ve/runs/<run-id>/parsl/workers --logconf=None --block_id=0 --hb_period=30  --hb_threshold=120 --drain_period=20700 --cpu-affinity list:1-8,105-112:9-16,113-120:17-24,121-128:25-32,129-136:33-40,137-144:41-48,145-152:53-60,157-164:61-68,165-172:69-76,173-180:77-84,181-188:85-92,189-196:93-100,197-204  --mpi-launcher=mpiexec --available-accelerators 0.0 0.1 1.0 1.1 2.0 2.1 3.0 3.1 4.0 4.1 5.0 5.1
MPIEXEC_EOF
chmod u+x ${SCRIPT_DIR:+$SCRIPT_DIR/}cmd_$JOBNAME.sh

mpiexec --cpu-bind none --ppn 1 -n $WORKERCOUNT --hostfile $HOSTFILE /usr/bin/sh ${SCRIPT_DIR:+$SCRIPT_DIR/}cmd_$JOBNAME.sh

[[ "1" == "1" ]] && echo "All workers done"


