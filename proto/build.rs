//! Generates the `dissem.v1` code from the .proto files with protox (a pure-Rust protobuf
//! compiler: no protoc install needed) and tonic-prost-build, and writes the encoded file
//! descriptor set that gRPC server reflection serves. The subset of etcd's v3 API that the
//! coordinator election uses (`etcd/etcd.proto`) is compiled the same way, on its own: it is
//! a client of someone else's service, not part of ours (reflection does not list it).

use std::path::PathBuf;

const FILES: &[&str] = &[
    "dissem/v1/common.proto",
    "dissem/v1/ingest.proto",
    "dissem/v1/objects.proto",
    "dissem/v1/subscriptions.proto",
    "dissem/v1/subscriber.proto",
    "dissem/v1/stream.proto",
    "dissem/v1/admin.proto",
    "dissem/v1/cluster.proto",
    "dissem/v1/federation.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for f in FILES {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(FILES, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("dissem_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .codec_path("crate::codec::DissemCodec")
        .compile_fds(fds)?;
    println!("cargo:rerun-if-changed=etcd/etcd.proto");
    let etcd = protox::compile(["etcd/etcd.proto"], ["."])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(etcd)?;
    Ok(())
}
