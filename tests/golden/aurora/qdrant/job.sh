# submit: qsub  -q capacity -A MyProject /projects/MyProject/pes2o-ve/store/vdb-points/<qdrant-key>/server/cluster/jobs/pes2o-vdb.qdrant-dad1f3b7
#!/bin/bash

#PBS -S /bin/bash
#PBS -N pes2o-vdb.qdrant-dad1f3b7
#PBS -m n
#PBS -l walltime=06:00:00
#PBS -l select=8:ncpus=208
#PBS -o /projects/MyProject/pes2o-ve/store/vdb-points/<qdrant-key>/server/cluster/jobs/pes2o-vdb.qdrant-dad1f3b7.stdout
#PBS -e /projects/MyProject/pes2o-ve/store/vdb-points/<qdrant-key>/server/cluster/jobs/pes2o-vdb.qdrant-dad1f3b7.stderr
#PBS -l filesystems=home:flare
#PBS -l place=scatter

module load apptainer

export JOBNAME="pes2o-vdb.qdrant-dad1f3b7"

mpiexec -n 32 --ppn 4 --cpu-bind list:1-24,105-128:25-48,129-152:53-76,157-180:77-100,181-204 /bin/bash '/projects/MyProject/pes2o-ve/store/vdb-points/<qdrant-key>/server/cluster/launch.sh'

