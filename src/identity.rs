//! Who is calling on `raft_addr`: the identity a verified client certificate names in its
//! URI subject alternative names, `spiffe://<cluster_id>/node/<id>` for a node and
//! `spiffe://<cluster_id>/admin` for the operator, and what each identity may call.
//!
//! TLS (rustls) has already checked the chain to the fleet CA and the validity dates before
//! a request reaches a service; this module only reads the name the CA vouched for. It
//! decides nothing about membership (the `Peer` service knows it) and never reads a payload.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Mutex;

use crate::lock::lock;

/// The longest `cluster_id`: a SPIFFE trust domain is at most 255 bytes.
pub const CLUSTER_ID_BYTES_MAX: usize = 255;

/// Checks that `cluster_id` can be the trust domain of the fleet's certificate identities:
/// 1 to 255 of `a-z`, `0-9`, `.`, `-`, `_` (SPIFFE's trust-domain alphabet).
///
/// # Errors
/// What is wrong with it, for a config error naming `cluster_id`.
pub fn check_cluster_id(cluster_id: &str) -> Result<(), String> {
    if cluster_id.is_empty() || cluster_id.len() > CLUSTER_ID_BYTES_MAX {
        return Err(format!("must be 1 to {CLUSTER_ID_BYTES_MAX} bytes"));
    }
    match cluster_id
        .chars()
        .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '.' | '-' | '_'))
    {
        Some(c) => Err(format!(
            "{c:?} is not allowed: use a-z, 0-9, '.', '-', '_' (it is the trust domain of \
             the certificate identities spiffe://<cluster_id>/...)"
        )),
        None => Ok(()),
    }
}

/// A node's id as its certificate names it: the same `u64` as `raft::NodeId`, spelled
/// here so that identity, which `raft` imports, imports nothing of `raft`.
pub type NodeId = u64;

/// The URI SAN of node `id`'s certificate.
pub fn node_uri(cluster_id: &str, id: NodeId) -> String {
    format!("spiffe://{cluster_id}/node/{id}")
}

/// The URI SAN of the operator's (admin) certificate.
pub fn admin_uri(cluster_id: &str) -> String {
    format!("spiffe://{cluster_id}/admin")
}

/// A verified certificate's identity in this fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    /// `spiffe://<cluster_id>/node/<id>`.
    Node(NodeId),
    /// `spiffe://<cluster_id>/admin`.
    Admin,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Node(id) => write!(f, "node {id}"),
            Self::Admin => f.write_str("admin"),
        }
    }
}

/// Who a call on `raft_addr` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// `raft_addr` is plaintext (a loopback fleet without `[peer_tls]`): nobody is
    /// authenticated, every local user of the host is a member (docs/security.md).
    Unauthenticated,
    /// The identity of the connection's verified client certificate.
    Verified(Identity),
}

/// Why a connection's certificate names no identity of this fleet.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("the connection presented no client certificate")]
    NoCertificate,
    #[error("the client certificate does not parse: {reason}")]
    Unparsable { reason: String },
    #[error(
        "the client certificate names no identity of cluster `{cluster_id}` \
         (spiffe://{cluster_id}/node/<id> or spiffe://{cluster_id}/admin); its URI SANs: {seen:?}"
    )]
    NoIdentity {
        cluster_id: String,
        seen: Vec<String>,
    },
    #[error("the client certificate names more than one identity: {seen:?}")]
    Ambiguous { seen: Vec<String> },
}

/// The identity of a DER certificate in fleet `cluster_id`: exactly one URI SAN of the form
/// `spiffe://<cluster_id>/node/<id>` (id a decimal number from 1) or
/// `spiffe://<cluster_id>/admin`. Other URI SANs (another fleet's, a company's) are ignored.
///
/// # Errors
/// A certificate that does not parse, names none of the two forms, or names several.
pub fn of_certificate(der: &[u8], cluster_id: &str) -> Result<Identity, IdentityError> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| IdentityError::Unparsable {
            reason: e.to_string(),
        })?;
    let names = cert
        .subject_alternative_name()
        .map_err(|e| IdentityError::Unparsable {
            reason: format!("subjectAltName: {e}"),
        })?;
    let uris: Vec<&str> = names
        .iter()
        .flat_map(|ext| ext.value.general_names.iter())
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some(*uri),
            _ => None,
        })
        .collect();
    let found: Vec<(Identity, &str)> = uris
        .iter()
        .filter_map(|uri| parse_uri(uri, cluster_id).map(|identity| (identity, *uri)))
        .collect();
    match found.as_slice() {
        [(identity, _)] => Ok(*identity),
        [] => Err(IdentityError::NoIdentity {
            cluster_id: cluster_id.to_owned(),
            seen: uris.iter().map(|uri| (*uri).to_owned()).collect(),
        }),
        several => Err(IdentityError::Ambiguous {
            seen: several.iter().map(|(_, uri)| (*uri).to_owned()).collect(),
        }),
    }
}

/// The identity `uri` names in fleet `cluster_id`, if it is one of the two forms.
fn parse_uri(uri: &str, cluster_id: &str) -> Option<Identity> {
    let path = uri
        .strip_prefix("spiffe://")?
        .strip_prefix(cluster_id)?
        .strip_prefix('/')?;
    if path == "admin" {
        return Some(Identity::Admin);
    }
    let digits = path.strip_prefix("node/")?;
    // `u64::from_str` takes a leading '+': only plain digits, no leading zero, name an id.
    if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(Identity::Node)
}

/// The caller of a request on `raft_addr`: [`Caller::Unauthenticated`] when the server runs
/// without TLS, else the identity of the connection's verified client certificate.
///
/// # Errors
/// With TLS on: no client certificate, or none of this fleet's identities in it.
pub fn caller_of<T>(
    request: &tonic::Request<T>,
    tls: bool,
    cluster_id: &str,
) -> Result<Caller, IdentityError> {
    if !tls {
        return Ok(Caller::Unauthenticated);
    }
    let certs = request.peer_certs().ok_or(IdentityError::NoCertificate)?;
    let leaf = certs.first().ok_or(IdentityError::NoCertificate)?;
    of_certificate(leaf, cluster_id).map(Caller::Verified)
}

/// The connections whose refusal was already logged, so a caller retrying a refused call
/// in a loop writes one log line per connection, not one per call; and at most
/// [`REFUSAL_LINES_PER_SECOND_MAX`] lines a second over all connections, so a caller that
/// opens connection after connection cannot flood the log either (the lines left out are
/// counted in the next one). Bounded: when full it starts afresh (a connection may then be
/// logged once more).
#[derive(Default)]
pub struct RefusalLog {
    state: Mutex<RefusalLogState>,
}

#[derive(Default)]
struct RefusalLogState {
    logged: HashSet<Option<SocketAddr>>,
    second: Option<std::time::Instant>,
    lines_this_second: u32,
    left_out: u64,
}

/// Connections remembered by [`RefusalLog`].
const REFUSALS_REMEMBERED_MAX: usize = 4096;
/// Refusal lines logged per second at most, over all connections.
pub const REFUSAL_LINES_PER_SECOND_MAX: u32 = 10;

impl RefusalLog {
    /// Logs `refusal` (at WARN) unless a refusal on the connection from `remote` was, or
    /// this second's lines are spent.
    pub fn once(&self, remote: Option<SocketAddr>, refusal: &str) {
        let mut state = lock(&self.state);
        if state.logged.len() >= REFUSALS_REMEMBERED_MAX {
            state.logged.clear();
        }
        if !state.logged.insert(remote) {
            return;
        }
        let now = std::time::Instant::now();
        if state
            .second
            .is_none_or(|start| now.duration_since(start) >= std::time::Duration::from_secs(1))
        {
            state.second = Some(now);
            state.lines_this_second = 0;
        }
        if state.lines_this_second >= REFUSAL_LINES_PER_SECOND_MAX {
            state.left_out += 1;
            return;
        }
        state.lines_this_second += 1;
        let left_out = std::mem::take(&mut state.left_out);
        tracing::warn!(?remote, refusal, left_out, "refused a call on raft_addr");
    }
}

/// A caller's string as a log line or an answer may show it: escaped (`Debug`) and cut to
/// 64 characters, so it can neither forge a line nor fill a log.
pub fn shown(text: &str) -> String {
    const SHOWN_CHARS_MAX: usize = 64;
    match text.char_indices().nth(SHOWN_CHARS_MAX) {
        Some((end, _)) => format!("{:?}...", &text[..end]),
        None => format!("{text:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_with(uris: &[&str]) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("p");
        for uri in uris {
            params.subject_alt_names.push(rcgen::SanType::URI(
                rcgen::string::Ia5String::try_from(*uri).expect("ia5"),
            ));
        }
        params.self_signed(&key).expect("sign").der().to_vec()
    }

    #[test]
    fn a_node_or_the_admin_of_this_cluster_is_read_from_the_uri_san() {
        let node = cert_with(&["spiffe://fleet-a/node/12"]);
        assert_eq!(of_certificate(&node, "fleet-a"), Ok(Identity::Node(12)));
        let admin = cert_with(&["https://example.com/x", "spiffe://fleet-a/admin"]);
        assert_eq!(of_certificate(&admin, "fleet-a"), Ok(Identity::Admin));
        assert_eq!(node_uri("fleet-a", 12), "spiffe://fleet-a/node/12");
        assert_eq!(admin_uri("fleet-a"), "spiffe://fleet-a/admin");
    }

    #[test]
    fn another_cluster_a_bad_id_none_or_two_identities_are_refused() {
        let other = cert_with(&["spiffe://fleet-b/node/1"]);
        let err = of_certificate(&other, "fleet-a").expect_err("another fleet");
        assert!(
            matches!(&err, IdentityError::NoIdentity { seen, .. } if seen == &["spiffe://fleet-b/node/1"]),
            "{err:?}"
        );
        // A prefix of the cluster id is not the cluster id.
        let prefix = cert_with(&["spiffe://fleet-ab/admin"]);
        assert!(of_certificate(&prefix, "fleet-a").is_err());
        for bad in [
            "spiffe://fleet-a/node/0",
            "spiffe://fleet-a/node/+3",
            "spiffe://fleet-a/node/03",
            "spiffe://fleet-a/node/",
            "spiffe://fleet-a/node/3/x",
            "spiffe://fleet-a/node/99999999999999999999",
            "spiffe://fleet-a/admin/",
        ] {
            let cert = cert_with(&[bad]);
            assert!(of_certificate(&cert, "fleet-a").is_err(), "{bad}");
        }
        let none = cert_with(&[]);
        assert!(matches!(
            of_certificate(&none, "fleet-a"),
            Err(IdentityError::NoIdentity { .. })
        ));
        let two = cert_with(&["spiffe://fleet-a/node/1", "spiffe://fleet-a/admin"]);
        assert!(matches!(
            of_certificate(&two, "fleet-a"),
            Err(IdentityError::Ambiguous { .. })
        ));
        assert!(matches!(
            of_certificate(b"not der", "fleet-a"),
            Err(IdentityError::Unparsable { .. })
        ));
    }

    #[test]
    fn caller_strings_are_shown_escaped_and_cut() {
        assert_eq!(shown("a\nb"), "\"a\\nb\"");
        let long = "é".repeat(100);
        let cut = shown(&long);
        assert!(
            cut.ends_with("...") && cut.chars().count() == 64 + 2 + 3,
            "{cut}"
        );
    }

    #[test]
    fn refusals_are_logged_once_per_connection_and_within_a_rate() {
        let log = RefusalLog::default();
        let addr = |port| Some(SocketAddr::from(([127, 0, 0, 1], port)));
        log.once(addr(1), "x");
        log.once(addr(1), "x");
        assert_eq!(lock(&log.state).lines_this_second, 1);
        for port in 2..40 {
            log.once(addr(port), "x");
        }
        let state = lock(&log.state);
        assert_eq!(state.lines_this_second, REFUSAL_LINES_PER_SECOND_MAX);
        assert_eq!(state.left_out, 39 - u64::from(REFUSAL_LINES_PER_SECOND_MAX));
    }

    #[test]
    fn cluster_ids_are_trust_domains() {
        assert!(check_cluster_id("ankusa-fleet").is_ok());
        assert!(check_cluster_id("prod.eu_1").is_ok());
        for bad in ["", "Fleet", "a/b", "a b", "é"] {
            assert!(check_cluster_id(bad).is_err(), "{bad:?}");
        }
        assert!(check_cluster_id(&"a".repeat(256)).is_err());
    }
}
