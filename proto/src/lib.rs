//! The `dissem.v1` gRPC API: the .proto files under `dissem/v1/` and the tonic/prost code
//! generated from them at build time (no protoc install needed). Only this crate and the
//! service adapters touch these types.

pub mod codec;

/// Generated messages, clients and servers of package `dissem.v1`.
#[allow(
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic,
    rust_2018_idioms
)]
pub mod v1 {
    tonic::include_proto!("dissem.v1");
}

/// Clients of the part of etcd's v3 API that coordinator election uses (package
/// `etcdserverpb`: `KV`, `Lease`, `Watch`, `Auth`).
#[allow(
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic,
    rust_2018_idioms
)]
pub mod etcd {
    tonic::include_proto!("etcdserverpb");
}

/// The encoded file descriptor set of every `dissem.v1` file, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("dissem_descriptor");
