//! MPI communicator (feature `mpi`): filled in below.
