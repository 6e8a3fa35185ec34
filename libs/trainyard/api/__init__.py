"""Job operations shared by the REST and gRPC front doors."""
