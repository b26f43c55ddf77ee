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
    envoy_rls_descriptors(&out_dir.join("envoy_rls_descriptor.bin"))?;
    Ok(())
}

/// The file Envoy's `RateLimitService` is declared in; reflection needs it and every file
/// it imports.
const RLS_PROTO: &str = "envoy/service/ratelimit/v3/rls.proto";

/// Writes to `out` the descriptors of [`RLS_PROTO`] and everything it imports, taken from
/// the descriptor set the `envoy-types` crate ships in its package
/// (`src/generated/types.bin`, all of Envoy's API) but does not export. The package is the
/// one Cargo resolved for this build, found with `cargo metadata`; no proto file is
/// copied into this repository.
fn envoy_rls_descriptors(out: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    use prost::Message;
    let cargo = std::env::var("CARGO")?;
    let manifest =
        std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("Cargo.toml");
    println!("cargo:rerun-if-changed=Cargo.lock");
    let metadata = std::process::Command::new(cargo)
        // Only this target's packages; a `cargo build` has not downloaded the tests' own
        // dependencies yet, so this may fetch them (as `cargo test` would), unless the
        // build is offline. The lock is the one this build resolved: never rewritten here.
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--filter-platform",
        ])
        .arg(std::env::var("TARGET")?)
        .args(
            std::env::var("CARGO_NET_OFFLINE")
                .is_ok_and(|offline| offline == "true")
                .then_some("--offline"),
        )
        .arg("--manifest-path")
        .arg(&manifest)
        .output()?;
    if !metadata.status.success() {
        return Err(format!(
            "cargo metadata: {}",
            String::from_utf8_lossy(&metadata.stderr)
        )
        .into());
    }
    let metadata: serde_json::Value = serde_json::from_slice(&metadata.stdout)?;
    // The envoy-types this package depends on (the lock may hold other versions); the
    // manifest named is this package's, so it is the resolve's root.
    let root = metadata["resolve"]["root"].clone();
    let envoy_id = metadata["resolve"]["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|node| node["id"] == root))
        .and_then(|node| node["deps"].as_array())
        .and_then(|deps| deps.iter().find(|dep| dep["name"] == "envoy_types"))
        .and_then(|dep| dep["pkg"].as_str())
        .ok_or("cargo metadata shows no envoy-types dependency of this package")?;
    let envoy_manifest = metadata["packages"]
        .as_array()
        .and_then(|packages| packages.iter().find(|package| package["id"] == envoy_id))
        .and_then(|package| package["manifest_path"].as_str())
        .ok_or("cargo metadata lists no envoy-types package")?;
    let set_path = std::path::Path::new(envoy_manifest)
        .parent()
        .ok_or("envoy-types' manifest has no directory")?
        .join("src/generated/types.bin");
    println!("cargo:rerun-if-changed={}", set_path.display());
    let set = prost_types::FileDescriptorSet::decode(std::fs::read(&set_path)?.as_slice())?;
    let by_name: std::collections::HashMap<&str, &prost_types::FileDescriptorProto> =
        set.file.iter().map(|file| (file.name(), file)).collect();
    let mut wanted = Vec::new();
    let mut stack = vec![RLS_PROTO];
    while let Some(name) = stack.pop() {
        if wanted
            .iter()
            .any(|file: &prost_types::FileDescriptorProto| file.name() == name)
        {
            continue;
        }
        let file = by_name
            .get(name)
            .ok_or_else(|| format!("{} lacks {name}", set_path.display()))?;
        stack.extend(file.dependency.iter().map(String::as_str));
        wanted.push((*file).clone());
    }
    let cut = prost_types::FileDescriptorSet { file: wanted };
    std::fs::write(out, cut.encode_to_vec())?;
    Ok(())
}
