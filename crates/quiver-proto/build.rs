//! Compiles `proto/quiver/v1/*.proto` with protox (pure Rust, no `protoc`) and
//! generates the prost messages and tonic clients/servers.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("../../proto");
    let proto_files = [
        "quiver/v1/meta.proto",
        "quiver/v1/raft.proto",
        "quiver/v1/data.proto",
        "quiver/v1/client.proto",
    ];
    for proto_file in &proto_files {
        println!(
            "cargo:rerun-if-changed={}",
            proto_root.join(proto_file).display()
        );
    }
    let file_descriptors = protox::compile(proto_files, [&proto_root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(file_descriptors)?;
    Ok(())
}
