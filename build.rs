//! Compiles proto/ with protox (pure Rust, no protoc needed) and generates the
//! tonic server and client code. The encoded descriptor set, google/protobuf
//! imports included, is written to OUT_DIR for server reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/aaa/v1/types.proto",
        "proto/aaa/v1/run.proto",
        "proto/aaa/v1/approval.proto",
        "proto/aaa/v1/worker.proto",
        "proto/aaa/v1/subscription.proto",
        "proto/aaa/v1/cluster.proto",
        "proto/aaa/v1/policy.proto",
        "proto/aaa/v1/grant.proto",
    ];
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(files, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("aaa_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
