#!/bin/bash
# Runs the script of this process's rank (PALS/MPICH, Slurm, Open MPI, or VDB_RANK for the local loop).
RANK=${PMI_RANK:-${PALS_RANKID:-${SLURM_PROCID:-${OMPI_COMM_WORLD_RANK:-${VDB_RANK:-0}}}}}
exec /bin/bash "$(dirname "$0")/ranks/rank-$(printf %03d "$RANK").sh"
