//! Compiles `proto/` with the vendored protoc, so a fresh machine needs no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=build.rs");
    // Every service decodes with api::wire::FleetCodec: a request that does not decode is
    // INVALID_ARGUMENT naming the field, not INTERNAL.
    // The edge API's descriptors are kept for gRPC reflection on api_addr; the internal
    // services are not served there, so they are compiled on their own.
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .codec_path("crate::api::wire::FleetCodec")
        .file_descriptor_set_path(out_dir.join("fleet_descriptor.bin"))
        .compile_protos(&["proto/fleet.proto"], &["proto"])?;
    tonic_prost_build::configure()
        .codec_path("crate::api::wire::FleetCodec")
        .compile_protos(&["proto/internal.proto"], &["proto"])?;
    Ok(())
}
