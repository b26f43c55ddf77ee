//! The snapshot format: a fixed header (magic, format version, body length, CRC-32 of the
//! body) followed by the encoded [`SnapshotBody`]. The checksum is computed when writing
//! and verified when reading, so a torn or corrupted snapshot is refused, never installed.
//!
//! This module turns a state image into bytes and back; keeping one in sled is [`store`],
//! receiving one from the leader (checked whole before openraft installs it) is
//! [`intake`]. When to take one and how one is built are the state machine's
//! (`raft::state_machine::policy`, `raft::state_machine::build`): they read it, and
//! nothing here reads them.

pub mod intake;
pub mod store;

use serde::{Deserialize, Serialize};

use crate::codec::{self, CodecError};
use crate::raft::{LogId, StoredMembership};
use crate::state::{FleetState, LiveImage, StateImage};

/// First bytes of every snapshot.
const MAGIC: [u8; 4] = *b"AKFS";
/// Bump when [`SnapshotBody`] changes shape; older nodes refuse newer snapshots, and this
/// one still reads [`FORMAT_VERSION_V1`]'s.
pub const FORMAT_VERSION: u32 = 2;
/// The format before the state kept absorb rounds (`StateImage::absorbed`).
pub const FORMAT_VERSION_V1: u32 = 1;
/// magic + version + body length + crc32.
pub const HEADER_LEN: usize = 4 + 4 + 8 + 4;

/// Everything a node needs to resume from a snapshot.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SnapshotBody {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub image: StateImage,
}

/// A snapshot could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotFormatError {
    #[error("snapshot shorter than its header ({len_bytes} bytes)")]
    Truncated { len_bytes: usize },
    #[error("not a snapshot (bad magic)")]
    BadMagic,
    #[error("snapshot format version {found} is neither {FORMAT_VERSION} nor {FORMAT_VERSION_V1}")]
    Version { found: u32 },
    #[error("snapshot body is {found_bytes} bytes, header says {expected_bytes}")]
    Length {
        found_bytes: u64,
        expected_bytes: u64,
    },
    #[error("snapshot checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("snapshot body: {0}")]
    Codec(#[from] CodecError),
}

/// What [`encode_live`] writes: the same shape as [`SnapshotBody`], borrowing the state.
#[derive(Serialize)]
struct SnapshotBodyRef<'a> {
    last_applied: Option<LogId>,
    membership: &'a StoredMembership,
    image: LiveImage<'a>,
}

/// Encodes a snapshot with its header and checksum.
///
/// # Errors
/// Only if the body cannot be encoded.
pub fn encode(body: &SnapshotBody) -> Result<Vec<u8>, CodecError> {
    sealed(body)
}

/// Encodes a snapshot straight from a live state (no copy of the state first); reads back
/// as the same [`SnapshotBody`] that [`encode`] would have written.
///
/// # Errors
/// Only if the body cannot be encoded.
pub fn encode_live(
    last_applied: Option<LogId>,
    membership: &StoredMembership,
    state: &FleetState,
) -> Result<Vec<u8>, CodecError> {
    let body = SnapshotBodyRef {
        last_applied,
        membership,
        image: LiveImage(state),
    };
    sealed(&body)
}

/// Encodes `body` behind its header (magic, version, length, CRC-32 of the body), in one
/// buffer of exactly the snapshot's size.
fn sealed<T: Serialize>(body: &T) -> Result<Vec<u8>, CodecError> {
    let mut bytes = codec::encode_exact(body, HEADER_LEN)?;
    let (header, payload) = bytes.split_at_mut(HEADER_LEN);
    header[0..4].copy_from_slice(&MAGIC);
    header[4..8].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    header[16..20].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
    Ok(bytes)
}

/// [`SnapshotBody`] as format 1 wrote it: the image without absorb rounds.
#[derive(Deserialize)]
struct SnapshotBodyV1 {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    image: StateImageV1,
}

#[derive(Deserialize)]
struct StateImageV1 {
    clock_us: u64,
    buckets: Vec<(crate::state::BucketKey, u64)>,
    claims: Vec<(crate::state::ClaimKey, crate::state::ClaimRecord)>,
}

/// Decodes a snapshot, verifying magic, version, length and checksum first; a format 1
/// snapshot reads as one whose state has absorbed no round yet.
///
/// # Errors
/// When any of those checks fails or the body does not decode.
pub fn decode(bytes: &[u8]) -> Result<SnapshotBody, SnapshotFormatError> {
    if bytes.len() < HEADER_LEN {
        return Err(SnapshotFormatError::Truncated {
            len_bytes: bytes.len(),
        });
    }
    let (header, payload) = bytes.split_at(HEADER_LEN);
    if check_header(header, payload.len() as u64, crc32fast::hash(payload))? == FORMAT_VERSION {
        return Ok(codec::decode(payload)?);
    }
    let v1: SnapshotBodyV1 = codec::decode(payload)?;
    Ok(SnapshotBody {
        last_applied: v1.last_applied,
        membership: v1.membership,
        image: StateImage {
            clock_us: v1.image.clock_us,
            buckets: v1.image.buckets,
            claims: v1.image.claims,
            absorbed: Vec::new(),
        },
    })
}

/// Checks a header against the body that follows it, given as its length and CRC-32 (which
/// a receiver can compute chunk by chunk, before the whole snapshot is in one buffer);
/// returns the format version.
///
/// # Errors
/// A short header, another magic or version, or a length or checksum that does not match.
pub fn check_header(
    header: &[u8],
    body_bytes: u64,
    body_crc: u32,
) -> Result<u32, SnapshotFormatError> {
    let Some(header) = header.get(..HEADER_LEN) else {
        return Err(SnapshotFormatError::Truncated {
            len_bytes: header.len(),
        });
    };
    if header[0..4] != MAGIC {
        return Err(SnapshotFormatError::BadMagic);
    }
    let version = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if version != FORMAT_VERSION && version != FORMAT_VERSION_V1 {
        return Err(SnapshotFormatError::Version { found: version });
    }
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(&header[8..16]);
    let expected_bytes = u64::from_le_bytes(len_bytes);
    if body_bytes != expected_bytes {
        return Err(SnapshotFormatError::Length {
            found_bytes: body_bytes,
            expected_bytes,
        });
    }
    let stored = u32::from_le_bytes([header[16], header[17], header[18], header[19]]);
    if stored != body_crc {
        return Err(SnapshotFormatError::Checksum {
            stored,
            computed: body_crc,
        });
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{BucketKey, Kind, TenantId};

    fn sample() -> SnapshotBody {
        SnapshotBody {
            image: StateImage {
                clock_us: 42,
                buckets: vec![(
                    BucketKey::Tenant {
                        kind: Kind::Hooks,
                        tenant: TenantId::from("t"),
                    },
                    100,
                )],
                claims: vec![],
                absorbed: vec![(3, 7)],
            },
            ..SnapshotBody::default()
        }
    }

    #[test]
    fn round_trip_keeps_the_image() {
        let bytes = encode(&sample()).expect("encode");
        let body = decode(&bytes).expect("decode");
        assert_eq!(body.image, sample().image);
    }

    #[test]
    fn a_live_state_encodes_like_its_image() {
        let mut state = FleetState::default();
        let charge = crate::state::Charge {
            bucket: BucketKey::Tenant {
                kind: Kind::Bytes,
                tenant: TenantId::from("t"),
            },
            increment_us: 10,
            capacity_us: 100,
        };
        let command = crate::state::Command::Hit {
            charges: vec![charge],
            claim: None,
            node: 1,
        };
        crate::state::rules::apply_batch(&mut state, &[command], 1_000);
        let body = SnapshotBody {
            image: state.image(),
            ..SnapshotBody::default()
        };
        let live = encode_live(None, &body.membership, &state).expect("encode live");
        assert_eq!(live, encode(&body).expect("encode image"));
        assert_eq!(decode(&live).expect("decode").image, body.image);
    }

    /// A snapshot of format 1 (before the state kept absorb rounds), as an older node
    /// stored or sends it, still reads: the same image, no round absorbed yet.
    #[test]
    fn a_format_1_snapshot_reads_with_no_absorb_rounds() {
        #[derive(Serialize)]
        struct BodyV1 {
            last_applied: Option<LogId>,
            membership: StoredMembership,
            image: ImageV1,
        }
        #[derive(Serialize)]
        struct ImageV1 {
            clock_us: u64,
            buckets: Vec<(BucketKey, u64)>,
            claims: Vec<(crate::state::ClaimKey, crate::state::ClaimRecord)>,
        }
        let expected = sample();
        let v1 = BodyV1 {
            last_applied: None,
            membership: StoredMembership::default(),
            image: ImageV1 {
                clock_us: expected.image.clock_us,
                buckets: expected.image.buckets.clone(),
                claims: vec![],
            },
        };
        let mut bytes = sealed(&v1).expect("encode");
        bytes[4..8].copy_from_slice(&FORMAT_VERSION_V1.to_le_bytes());
        let body = decode(&bytes).expect("a format 1 snapshot reads");
        assert_eq!(
            body.image,
            StateImage {
                absorbed: vec![],
                ..expected.image
            }
        );
    }

    #[test]
    fn a_flipped_bit_is_refused() {
        let mut bytes = encode(&sample()).expect("encode");
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        assert!(matches!(
            decode(&bytes),
            Err(SnapshotFormatError::Checksum { .. })
        ));
    }

    #[test]
    fn truncation_and_foreign_versions_are_refused() {
        let bytes = encode(&sample()).expect("encode");
        assert!(matches!(
            decode(&bytes[..bytes.len() - 1]),
            Err(SnapshotFormatError::Length { .. })
        ));
        assert!(matches!(
            decode(&bytes[..3]),
            Err(SnapshotFormatError::Truncated { .. })
        ));
        let mut newer = bytes.clone();
        newer[4] = 9;
        assert!(matches!(
            decode(&newer),
            Err(SnapshotFormatError::Version { found: 9 })
        ));
    }
}
