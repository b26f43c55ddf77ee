//! `ankusa-fleet certs`: make a fleet CA, one certificate per node and an admin client
//! certificate (with rcgen), for `[peer_tls]`. Each leaf names its identity as a URI SAN
//! (`spiffe://<cluster_id>/node/<id>` or `spiffe://<cluster_id>/admin`, `crate::identity`),
//! which the `Peer` and `Admin` services check.

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::tls::{read_pem, Holds, TlsError};

/// What `ankusa-fleet certs` makes.
#[derive(Debug, clap::Args)]
pub struct CertsPlan {
    /// Where to write `ca.pem`, `ca.key`, `nodeN.pem`, `nodeN.key`, `admin.pem`, `admin.key`.
    /// A CA already there is reused (new node certificates for a running fleet); existing
    /// node certificates are kept.
    #[arg(long)]
    pub out: PathBuf,
    /// Node certificates to make, for ids 1 to N.
    #[arg(long)]
    pub nodes: u64,
    /// A host a node is reached at, as `ID=NAME` (an IP address or DNS name in its
    /// `raft_addr`); repeat for more. Every node certificate also names 127.0.0.1, ::1 and
    /// localhost.
    #[arg(long = "host", value_parser = parse_host)]
    pub hosts: Vec<(u64, String)>,
    /// The fleet's `cluster_id`: the certificates name `spiffe://<cluster_id>/node/<id>`
    /// and `spiffe://<cluster_id>/admin`, and a node accepts only its own cluster's.
    #[arg(long, default_value = crate::config::Defaults::CLUSTER_ID)]
    pub cluster_id: String,
    /// Days a node or admin certificate is valid, from now.
    #[arg(long, default_value_t = CertsPlan::LEAF_DAYS, value_parser = clap::value_parser!(u32).range(1..=CertsPlan::DAYS_MAX as i64))]
    pub days: u32,
    /// Days a new CA is valid, from now (a CA already in `--out` is kept as it is).
    #[arg(long, default_value_t = CertsPlan::CA_DAYS, value_parser = clap::value_parser!(u32).range(1..=CertsPlan::DAYS_MAX as i64))]
    pub ca_days: u32,
}

impl CertsPlan {
    /// A leaf's validity unless `--days` says otherwise: a year, so a lost key stops
    /// working by itself (there is no revocation list).
    pub const LEAF_DAYS: u32 = 365;
    /// A new CA's validity unless `--ca-days` says otherwise: ten years.
    pub const CA_DAYS: u32 = 3650;
    /// The longest validity either takes: a hundred years.
    pub const DAYS_MAX: u32 = 36_500;

    /// The plan for `nodes` node certificates of fleet `cluster_id` in `out`, with no
    /// `--host` and the default validities.
    pub fn new(out: PathBuf, nodes: u64, cluster_id: &str) -> Self {
        Self {
            out,
            nodes,
            hosts: Vec::new(),
            cluster_id: cluster_id.to_owned(),
            days: Self::LEAF_DAYS,
            ca_days: Self::CA_DAYS,
        }
    }
}

fn parse_host(text: &str) -> Result<(u64, String), String> {
    let (id, name) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}`: expected ID=NAME"))?;
    let id = id.parse().map_err(|_| format!("`{id}`: not a node id"))?;
    Ok((id, name.to_owned()))
}

/// The names every node certificate carries, so a fleet on one host works as made.
const LOOPBACK_NAMES: [&str; 3] = ["127.0.0.1", "::1", "localhost"];

/// Makes (or reuses) the fleet CA in `plan.out` and a certificate for every node id from 1
/// to `plan.nodes` that has none yet, plus an `admin` client certificate. Returns the files
/// written.
///
/// # Errors
/// When a file cannot be read or written, or rcgen refuses a parameter.
pub fn make_certs(plan: &CertsPlan) -> Result<Vec<PathBuf>, TlsError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose, SanType,
    };
    crate::identity::check_cluster_id(&plan.cluster_id).map_err(|reason| TlsError::File {
        field: "--cluster-id".to_owned(),
        path: plan.out.clone(),
        reason,
    })?;
    let out = &plan.out;
    std::fs::create_dir_all(out).map_err(|source| TlsError::Write {
        path: out.clone(),
        source,
    })?;
    let mut written = Vec::new();
    let (ca_pem_path, ca_key_path) = (out.join("ca.pem"), out.join("ca.key"));
    if ca_pem_path.exists() != ca_key_path.exists() {
        // Making a new CA here would replace the one the fleet trusts.
        let (present, missing) = if ca_pem_path.exists() {
            (&ca_pem_path, &ca_key_path)
        } else {
            (&ca_key_path, &ca_pem_path)
        };
        return Err(TlsError::File {
            field: "--out".to_owned(),
            path: missing.clone(),
            reason: format!(
                "missing beside {}: signing needs both; put it back, or use a new --out for a new CA",
                present.display()
            ),
        });
    }
    let issuer = if ca_pem_path.exists() {
        let key = KeyPair::from_pem(&read_text(&ca_key_path)?)?;
        Issuer::from_ca_cert_pem(&read_text(&ca_pem_path)?, key)?
    } else {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params
            .distinguished_name
            .push(DnType::CommonName, "ankusa-fleet CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        (params.not_before, params.not_after) = validity(plan.ca_days);
        let cert = params.self_signed(&key)?;
        write_file(&ca_pem_path, cert.pem().as_bytes(), false)?;
        write_file(&ca_key_path, key.serialize_pem().as_bytes(), true)?;
        written.extend([ca_pem_path, ca_key_path]);
        Issuer::new(params, key)
    };
    let mut leaf = |name: &str,
                    common_name: String,
                    (sans, uri): (Vec<String>, String),
                    usages: Vec<ExtendedKeyUsagePurpose>|
     -> Result<(), TlsError> {
        let (cert_path, key_path) = (
            out.join(format!("{name}.pem")),
            out.join(format!("{name}.key")),
        );
        match (cert_path.exists(), key_path.exists()) {
            (true, true) => return kept(&cert_path, &uri),
            (false, false) => {}
            _ => {
                return Err(TlsError::File {
                    field: "--out".to_owned(),
                    path: cert_path,
                    reason: format!("{name}.pem and {name}.key must both exist or neither"),
                })
            }
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(sans)?;
        params
            .subject_alt_names
            .push(SanType::URI(uri.as_str().try_into()?));
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        (params.not_before, params.not_after) = validity(plan.days);
        params.extended_key_usages = usages;
        let cert = params.signed_by(&key, &issuer)?;
        write_file(&cert_path, cert.pem().as_bytes(), false)?;
        write_file(&key_path, key.serialize_pem().as_bytes(), true)?;
        written.extend([cert_path, key_path]);
        Ok(())
    };
    for id in 1..=plan.nodes {
        let mut sans: Vec<String> = LOOPBACK_NAMES.iter().map(|n| (*n).to_owned()).collect();
        sans.extend(
            plan.hosts
                .iter()
                .filter(|(host_id, _)| *host_id == id)
                .map(|(_, name)| name.clone()),
        );
        // A node is a server to its peers and a client of theirs.
        let usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let uri = crate::identity::node_uri(&plan.cluster_id, id);
        leaf(
            &format!("node{id}"),
            format!("ankusa-fleet node {id}"),
            (sans, uri),
            usages,
        )?;
    }
    leaf(
        "admin",
        "ankusa-fleet admin".to_owned(),
        (Vec::new(), crate::identity::admin_uri(&plan.cluster_id)),
        vec![ExtendedKeyUsagePurpose::ClientAuth],
    )?;
    Ok(written)
}

/// Checks that a certificate kept from an earlier run names `uri` (certificates made before
/// identities existed, or for another `--cluster-id`, would be refused on `raft_addr`).
fn kept(cert_path: &Path, uri: &str) -> Result<(), TlsError> {
    let pem = read_pem("--out", cert_path, Holds::Certificates)?;
    let names_it = CertificateDer::pem_slice_iter(&pem)
        .next()
        .and_then(Result::ok)
        .and_then(|der| {
            let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
            let sans = cert.subject_alternative_name().ok()??;
            Some(sans.value.general_names.iter().any(
                |name| matches!(name, x509_parser::extensions::GeneralName::URI(found) if *found == uri),
            ))
        })
        .unwrap_or(false);
    if names_it {
        return Ok(());
    }
    Err(TlsError::File {
        field: "--out".to_owned(),
        path: cert_path.to_owned(),
        reason: format!(
            "kept from an earlier run, but it does not name {uri}: delete it and its key to \
             make a new one"
        ),
    })
}

/// From an hour ago (a little clock skew between the maker and the fleet is no outage) to
/// `days` from now.
fn validity(days: u32) -> (time::OffsetDateTime, time::OffsetDateTime) {
    let now = time::OffsetDateTime::now_utc();
    (
        now - time::Duration::hours(1),
        now + time::Duration::days(i64::from(days)),
    )
}

fn read_text(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Write {
        path: path.to_owned(),
        source,
    })
}

/// Writes a new file; a private key is readable by its owner only.
fn write_file(path: &Path, bytes: &[u8], private: bool) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let failed = |source| TlsError::Write {
        path: path.to_owned(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if private {
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(failed)?;
    file.write_all(bytes).map_err(failed)?;
    file.sync_all().map_err(failed)
}

/// Makes the certificates `plan` asks for and prints each file written.
///
/// # Errors
/// As [`make_certs`].
pub fn run(plan: &CertsPlan) -> anyhow::Result<()> {
    for path in make_certs(plan)? {
        println!("wrote {}", path.display());
    }
    Ok(())
}
