//! gRPC service definitions and generated code for the `dissem.v1` API. Not built yet: the storage-node issue fills it.
