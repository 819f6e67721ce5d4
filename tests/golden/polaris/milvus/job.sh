# submit: qsub  -q prod -A MyProject /projects/MyProject/pes2o-ve/store/vdb-points/<milvus-key>/server/cluster/jobs/pes2o-vdb.milvus-da7b3d8e
#!/bin/bash

#PBS -S /bin/bash
#PBS -N pes2o-vdb.milvus-da7b3d8e
#PBS -m n
#PBS -l walltime=03:00:00
#PBS -l select=10:ncpus=64:ngpus=4
#PBS -o /projects/MyProject/pes2o-ve/store/vdb-points/<milvus-key>/server/cluster/jobs/pes2o-vdb.milvus-da7b3d8e.stdout
#PBS -e /projects/MyProject/pes2o-ve/store/vdb-points/<milvus-key>/server/cluster/jobs/pes2o-vdb.milvus-da7b3d8e.stderr
#PBS -l filesystems=home:eagle
#PBS -l place=scatter

module use /soft/modulefiles
module load spack-pe-base
module load apptainer

export JOBNAME="pes2o-vdb.milvus-da7b3d8e"

mpiexec -n 40 --ppn 4 --cpu-bind list:0-7,32-39:8-15,40-47:16-23,48-55:24-31,56-63 /bin/bash '/projects/MyProject/pes2o-ve/store/vdb-points/<milvus-key>/server/cluster/launch.sh'

