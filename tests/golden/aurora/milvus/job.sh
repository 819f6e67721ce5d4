# submit: qsub  -q capacity -A MyProject /projects/MyProject/pes2o-ve/store/vdb-points/<milvus-key>/server/cluster/jobs/pes2o-vdb.milvus-da7b3d8e
#!/bin/bash

#PBS -S /bin/bash
#PBS -N pes2o-vdb.milvus-da7b3d8e
#PBS -m n
#PBS -l walltime=06:00:00
#PBS -l select=8:ncpus=208
#PBS -o /projects/MyProject/pes2o-ve/store/vdb-points/<milvus-key>/server/cluster/jobs/pes2o-vdb.milvus-da7b3d8e.stdout
#PBS -e /projects/MyProject/pes2o-ve/store/vdb-points/<milvus-key>/server/cluster/jobs/pes2o-vdb.milvus-da7b3d8e.stderr
#PBS -l filesystems=home:flare:daos_user_fs
#PBS -l place=scatter

module load apptainer
module use /soft/modulefiles
module load daos
launch-dfuse.sh MyPool:vdb

export JOBNAME="pes2o-vdb.milvus-da7b3d8e"

mpiexec -n 32 --ppn 4 --cpu-bind list:1-24,105-128:25-48,129-152:53-76,157-180:77-100,181-204 /bin/bash '/projects/MyProject/pes2o-ve/store/vdb-points/<milvus-key>/server/cluster/launch.sh'

