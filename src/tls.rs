//! TLS for both servers and for every client of `raft_addr`: load and check the PEM files
//! that `[peer_tls]` and `[api_tls]` name, and build tonic's rustls configurations. The
//! certificates themselves are made by `ankusa-fleet certs` (`cmd::certs`).
//!
//! A client certificate must chain to `ca_file` (rustls checks the chain and the dates); who
//! it is comes from its URI SAN (`crate::identity`), which `certs` writes as
//! `spiffe://<cluster_id>/node/<id>` or `spiffe://<cluster_id>/admin`. A server certificate
//! must also name the host the caller dialled (the IP address or DNS name in `raft_addr`).
//! This module never decides who may do what: the `Peer` and `Admin` services do.

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

use crate::config::{ApiTlsFiles, PeerTlsFiles};
use crate::limits::TLS_HANDSHAKE_TIMEOUT;

/// A TLS file that cannot be used, or certificates that cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("config key `{field}`: {path}: {reason}")]
    File {
        field: String,
        path: PathBuf,
        reason: String,
    },
    #[error("making certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("tls: {0}")]
    Config(String),
}

/// What a PEM file must hold.
#[derive(Clone, Copy)]
pub(crate) enum Holds {
    Certificates,
    PrivateKey,
}

/// Reads `path` and checks it holds what `field` needs, so a wrong file fails at start-up
/// with the key's name instead of at the first handshake.
pub(crate) fn read_pem(field: &str, path: &Path, holds: Holds) -> Result<Vec<u8>, TlsError> {
    let failed = |reason: String| TlsError::File {
        field: field.to_owned(),
        path: path.to_owned(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| failed(e.to_string()))?;
    match holds {
        Holds::Certificates => {
            let certs = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| failed(format!("not a PEM certificate file: {e}")))?;
            if certs.is_empty() {
                return Err(failed("holds no certificate".to_owned()));
            }
        }
        Holds::PrivateKey => {
            PrivateKeyDer::from_pem_slice(&pem)
                .map_err(|e| failed(format!("holds no private key: {e}")))?;
        }
    }
    Ok(pem)
}

/// `[peer_tls]`, loaded: this node's certificate and the fleet CA (bundle).
#[derive(Clone)]
pub struct PeerTls {
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl PeerTls {
    /// Reads and checks the three files.
    ///
    /// # Errors
    /// A file that cannot be read or does not hold a certificate (key), by config key.
    pub fn load(files: &PeerTlsFiles) -> Result<Self, TlsError> {
        Ok(Self {
            ca: read_pem("peer_tls.ca_file", &files.ca_file, Holds::Certificates)?,
            cert: read_pem("peer_tls.cert_file", &files.cert_file, Holds::Certificates)?,
            key: read_pem("peer_tls.key_file", &files.key_file, Holds::PrivateKey)?,
        })
    }

    /// `raft_addr`'s server: presents this node's certificate and requires a client
    /// certificate that chains to the CA (plaintext, none or another CA's: refused at the
    /// handshake).
    pub fn server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert, &self.key))
            .client_ca_root(Certificate::from_pem(&self.ca))
            .timeout(TLS_HANDSHAKE_TIMEOUT)
    }

    /// Calls to another node's `raft_addr`: present this node's certificate, verify the
    /// peer's against the CA and the dialled host.
    pub fn client(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(&self.cert, &self.key))
            .timeout(TLS_HANDSHAKE_TIMEOUT)
    }
}

/// `[api_tls]`, loaded.
#[derive(Clone)]
pub struct ApiTls {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl ApiTls {
    /// Reads and checks the files.
    ///
    /// # Errors
    /// As [`PeerTls::load`].
    pub fn load(files: &ApiTlsFiles) -> Result<Self, TlsError> {
        Ok(Self {
            cert: read_pem("api_tls.cert_file", &files.cert_file, Holds::Certificates)?,
            key: read_pem("api_tls.key_file", &files.key_file, Holds::PrivateKey)?,
            client_ca: files
                .client_ca_file
                .as_deref()
                .map(|path| read_pem("api_tls.client_ca_file", path, Holds::Certificates))
                .transpose()?,
        })
    }

    /// `api_addr`'s server: TLS only; with a client CA, edge clients must present a
    /// certificate signed by it.
    pub fn server(&self) -> ServerTlsConfig {
        let config = ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert, &self.key))
            .timeout(TLS_HANDSHAKE_TIMEOUT);
        match &self.client_ca {
            Some(ca) => config.client_ca_root(Certificate::from_pem(ca)),
            None => config,
        }
    }
}

/// A client's TLS from PEM files (the `cluster` commands, tests): `ca` verifies the server,
/// `cert` and `key`, if given, are presented.
///
/// # Errors
/// A file that cannot be read or holds the wrong thing.
pub fn client_from_files(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<ClientTlsConfig, TlsError> {
    let ca = read_pem("--ca", ca, Holds::Certificates)?;
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .timeout(TLS_HANDSHAKE_TIMEOUT);
    Ok(match identity {
        Some((cert, key)) => config.identity(Identity::from_pem(
            read_pem("--cert", cert, Holds::Certificates)?,
            read_pem("--key", key, Holds::PrivateKey)?,
        )),
        None => config,
    })
}

/// An endpoint for `addr` (`host:port`): `https` with `tls`, plain `http` without.
///
/// # Errors
/// When `addr` is not a valid authority or rustls refuses the configuration.
pub fn endpoint(addr: &str, tls: Option<&ClientTlsConfig>) -> Result<Endpoint, TlsError> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .map_err(|e| TlsError::Config(format!("address `{addr}`: {e}")))?;
    match tls {
        Some(tls) => endpoint
            .tls_config(tls.clone())
            .map_err(|e| TlsError::Config(e.to_string())),
        None => Ok(endpoint),
    }
}
