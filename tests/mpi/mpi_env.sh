# Shared settings for tests under mpirun: allow root (CI runs as root), oversubscribe the 2 CI
# cores, one OpenMP thread per rank, no network probing beyond this host.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
MPI_FLAGS="--oversubscribe --bind-to none --mca btl self,vader"
