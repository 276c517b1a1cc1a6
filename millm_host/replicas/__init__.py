"""Several replicas on one database: who this replica is, and its convergence to the desired state."""
