//! Compiles proto/ with protox (pure Rust, no protoc needed) and generates the
//! tonic server and client code. The encoded descriptor set, google/protobuf
//! imports and custom options included, is written to OUT_DIR for server
//! reflection, and the cluster's routing table is generated from each rpc's
//! `aaa.v1.route` option (see build/routes.rs).

use std::path::PathBuf;

#[path = "build/routes.rs"]
mod routes;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/aaa/v1/routing.proto",
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
    println!("cargo:rerun-if-changed=build");
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler
        .include_source_info(true)
        .include_imports(true)
        .open_files(files)?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    // Encoded by protox, not from the prost types below: they would drop
    // the custom options (`aaa.v1.route`).
    std::fs::write(
        out_dir.join("aaa_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    match routes::generate(&compiler.descriptor_pool()) {
        Ok(code) => std::fs::write(out_dir.join("aaa_routes.rs"), code)?,
        Err(problems) => {
            // As warnings, cargo shows them above its own error.
            for problem in &problems {
                println!("cargo:warning={problem}");
                eprintln!("{problem}");
            }
            std::process::exit(1);
        }
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
