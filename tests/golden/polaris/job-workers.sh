# submit: qsub  -q prod -A MyProject /projects/MyProject/pes2o-ve/runs/<run-id>/parsl/000/submit_scripts/parsl.workers.block-0
#!/bin/bash

#PBS -S /bin/bash
#PBS -N parsl.workers.block-0
#PBS -m n
#PBS -l walltime=03:00:00
#PBS -l select=16:ncpus=64:ngpus=4
#PBS -o /projects/MyProject/pes2o-ve/runs/<run-id>/parsl/000/submit_scripts/parsl.workers.block-0.stdout
#PBS -e /projects/MyProject/pes2o-ve/runs/<run-id>/parsl/000/submit_scripts/parsl.workers.block-0.stderr
#PBS -l filesystems=home:eagle
#PBS -l place=scatter

module use /soft/modulefiles
module load conda
source /projects/MyProject/venv/bin/activate
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
process_worker_pool.py  --max_workers_per_node=4 -a <login-node-address> -p 0 -c 8.0 -m None --poll 10 --port=<interchange-worker-port> --cert_dir /projects/MyProject/pes2o-ve/runs/<run-id>/parsl/000/workers/certificates --logdir=/projects/MyProject/pes2o-ve/runs/<run-id>/parsl/workers --logconf=None --block_id=0 --hb_period=30  --hb_threshold=120 --drain_period=9900 --cpu-affinity list:24-31,56-63:16-23,48-55:8-15,40-47:0-7,32-39  --mpi-launcher=mpiexec --available-accelerators 0 1 2 3
MPIEXEC_EOF
chmod u+x ${SCRIPT_DIR:+$SCRIPT_DIR/}cmd_$JOBNAME.sh

mpiexec --cpu-bind none --depth=64 --ppn 1 -n $WORKERCOUNT --hostfile $HOSTFILE /usr/bin/sh ${SCRIPT_DIR:+$SCRIPT_DIR/}cmd_$JOBNAME.sh

[[ "1" == "1" ]] && echo "All workers done"


