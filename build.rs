//! Compiles `proto/` with the vendored protoc, so a fresh machine needs no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=build.rs");
    // Every service decodes with api::wire::FleetCodec: a request that does not decode is
    // INVALID_ARGUMENT naming the field, not INTERNAL.
    tonic_prost_build::configure()
        .codec_path("crate::api::wire::FleetCodec")
        .compile_protos(&["proto/fleet.proto", "proto/internal.proto"], &["proto"])?;
    Ok(())
}
