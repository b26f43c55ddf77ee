//! Compiles the edge API from the repository's `proto/fleet.proto` with the vendored protoc
//! (a fresh machine needs no system protoc). Only the client side is generated.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=../proto/fleet.proto");
    println!("cargo:rerun-if-changed=build.rs");
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&["../proto/fleet.proto"], &["../proto"])?;
    Ok(())
}
