# submit: qsub  -q capacity -A MyProject /projects/MyProject/pes2o-ve/runs/<run-id>/parsl/000/submit_scripts/parsl.cpu.block-0
#!/bin/bash

#PBS -S /bin/bash
#PBS -N parsl.cpu.block-0
#PBS -m n
#PBS -l walltime=06:00:00
#PBS -l select=8:ncpus=208
#PBS -o /projects/MyProject/pes2o-ve/runs/<run-id>/parsl/000/submit_scripts/parsl.cpu.block-0.stdout
#PBS -e /projects/MyProject/pes2o-ve/runs/<run-id>/parsl/000/submit_scripts/parsl.cpu.block-0.stderr
#PBS -l filesystems=home:flare
#PBS -l place=scatter

module load frameworks
source /projects/MyProject/venv/bin/activate
export PATH="<venv>/bin:$PATH"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

export JOBNAME="parsl.cpu.block-0"

set -e
export CORES=$(getconf _NPROCESSORS_ONLN)
[[ "1" == "1" ]] && echo "Found cores : $CORES"
WORKERCOUNT=8
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
process_worker_pool.py  --max_workers_per_node=48 -a <login-node-address> -p 0 -c 4.0 -m None --poll 10 --port=<interchange-worker-port> --cert_dir /projects/MyProject/pes2o-ve/runs/<run-id>/parsl/000/cpu/certificates --logdir=/projects/MyProject/pes2o-ve/runs/<run-id>/parsl/cpu --logconf=None --block_id=0 --hb_period=30  --hb_threshold=120 --drain_period=20700 --cpu-affinity list:1-2,105-106:3-4,107-108:5-6,109-110:7-8,111-112:9-10,113-114:11-12,115-116:13-14,117-118:15-16,119-120:17-18,121-122:19-20,123-124:21-22,125-126:23-24,127-128:25-26,129-130:27-28,131-132:29-30,133-134:31-32,135-136:33-34,137-138:35-36,139-140:37-38,141-142:39-40,143-144:41-42,145-146:43-44,147-148:45-46,149-150:47-48,151-152:49-50,153-154:53-54,157-158:55-56,159-160:57-58,161-162:59-60,163-164:61-62,165-166:63-64,167-168:65-66,169-170:67-68,171-172:69-70,173-174:71-72,175-176:73-74,177-178:75-76,179-180:77-78,181-182:79-80,183-184:81-82,185-186:83-84,187-188:85-86,189-190:87-88,191-192:89-90,193-194:91-92,195-196:93-94,197-198:95-96,199-200:97-98,201-202  --mpi-launcher=mpiexec --available-accelerators 
MPIEXEC_EOF
chmod u+x ${SCRIPT_DIR:+$SCRIPT_DIR/}cmd_$JOBNAME.sh

mpiexec --cpu-bind none --ppn 1 -n $WORKERCOUNT --hostfile $HOSTFILE /usr/bin/sh ${SCRIPT_DIR:+$SCRIPT_DIR/}cmd_$JOBNAME.sh

[[ "1" == "1" ]] && echo "All workers done"


