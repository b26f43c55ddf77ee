//! A command as the bytes it travels and is stored in. The node that builds (or, for a
//! forwarded one, re-checks) a command encodes it once; the forward, the leader's entry,
//! the WAL, `AppendEntries` and a follower's WAL carry those bytes as they are, and only
//! the checks and apply decode them. Plain data: no IO.

use bytes::Bytes;
use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::ser::{SerializeStructVariant, Serializer};
use serde::{Deserialize, Serialize};

use super::model::{Charge, ClaimRequest, Command, NodeId};
use crate::codec::{self, CodecError};

/// One [`Command`], encoded (`codec`, bincode). Cloning shares the bytes.
///
/// In a larger value (an entry, a `Propose` frame) it is a byte string: its length, then
/// its bytes, so encoding the value copies them and never encodes the command again, and
/// decoding it copies them and never decodes the command.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct EncodedCommand(Bytes);

/// `Command::Hit`'s position among `Command`'s variants: what serde writes for it.
const HIT_VARIANT_INDEX: u32 = 0;

/// A `Command::Hit` made of borrowed parts, encoding exactly as the owned value does
/// (`encoded::tests` holds it to that), so the node need not clone a hit's charges and
/// claim to propose it.
struct HitParts<'a> {
    charges: &'a [Charge],
    claim: Option<&'a ClaimRequest>,
    node: NodeId,
}

impl Serialize for HitParts<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut hit =
            serializer.serialize_struct_variant("Command", HIT_VARIANT_INDEX, "Hit", 3)?;
        hit.serialize_field("charges", self.charges)?;
        hit.serialize_field("claim", &self.claim)?;
        hit.serialize_field("node", &self.node)?;
        hit.end()
    }
}

impl EncodedCommand {
    /// Encodes `command`.
    ///
    /// # Errors
    /// Only if serde refuses the value (never for a `Command`: every sequence in it has a
    /// known length).
    pub fn encode(command: &Command) -> Result<Self, CodecError> {
        Ok(Self(Bytes::from(codec::encode(command)?)))
    }

    /// Encodes each of `commands`, in order.
    ///
    /// # Errors
    /// As [`EncodedCommand::encode`].
    pub fn encode_all(commands: &[Command]) -> Result<Vec<Self>, CodecError> {
        commands.iter().map(Self::encode).collect()
    }

    /// Encodes `Command::Hit { charges, claim, node }` from borrowed parts: the same bytes as
    /// [`EncodedCommand::encode`] of the owned command.
    ///
    /// # Errors
    /// As [`EncodedCommand::encode`].
    pub fn hit(
        charges: &[Charge],
        claim: Option<&ClaimRequest>,
        node: NodeId,
    ) -> Result<Self, CodecError> {
        let parts = HitParts {
            charges,
            claim,
            node,
        };
        Ok(Self(Bytes::from(codec::encode(&parts)?)))
    }

    /// Takes `bytes` as a command's encoding, unchecked: [`EncodedCommand::decode`] says
    /// whether they are one.
    pub fn from_bytes(bytes: Bytes) -> Self {
        Self(bytes)
    }

    /// Decodes the command (the whole buffer: trailing bytes are an error).
    ///
    /// # Errors
    /// When the bytes are not exactly one encoded `Command`.
    pub fn decode(&self) -> Result<Command, CodecError> {
        codec::decode(&self.0)
    }

    /// The encoding.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it has no bytes (no command encodes to none).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for EncodedCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.decode() {
            Ok(command) => f.debug_tuple("EncodedCommand").field(&command).finish(),
            Err(_) => write!(f, "EncodedCommand(<{} bytes, not a command>)", self.0.len()),
        }
    }
}

impl Serialize for EncodedCommand {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for EncodedCommand {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_byte_buf(BytesVisitor)
    }
}

struct BytesVisitor;

impl<'de> Visitor<'de> for BytesVisitor {
    type Value = EncodedCommand;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an encoded command (a byte string)")
    }

    fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Self::Value, E> {
        Ok(EncodedCommand(Bytes::copy_from_slice(bytes)))
    }

    fn visit_byte_buf<E: serde::de::Error>(self, bytes: Vec<u8>) -> Result<Self::Value, E> {
        Ok(EncodedCommand(Bytes::from(bytes)))
    }

    /// Formats without byte strings (JSON) write them as a sequence of numbers.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(byte) = seq.next_element::<u8>()? {
            bytes.push(byte);
        }
        Ok(EncodedCommand(Bytes::from(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{BucketKey, ClaimKey, Kind};

    fn charge(tenant: &str) -> Charge {
        Charge {
            bucket: BucketKey::Tenant {
                kind: Kind::Hooks,
                tenant: tenant.into(),
            },
            increment_us: 1_000,
            capacity_us: 60_000_000,
        }
    }

    fn claim() -> ClaimRequest {
        ClaimRequest {
            key: ClaimKey {
                tenant: "acme".into(),
                source_id: "stripe".into(),
                key: "evt_1".into(),
            },
            hook_id: "hook-1".into(),
            ttl_ms: 86_400_000,
            pending_ttl_ms: 30_000,
        }
    }

    #[test]
    fn a_hit_from_its_parts_encodes_as_the_owned_hit() {
        let cases: [(Vec<Charge>, Option<ClaimRequest>, NodeId); 4] = [
            (vec![charge("a"), charge("b")], Some(claim()), 3),
            (Vec::new(), Some(claim()), 1),
            (vec![charge("a")], None, u64::MAX),
            (Vec::new(), None, 0),
        ];
        for (charges, claim, node) in cases {
            let parts = EncodedCommand::hit(&charges, claim.as_ref(), node).expect("encode");
            let owned = Command::Hit {
                charges,
                claim,
                node,
            };
            assert_eq!(
                parts.as_bytes(),
                codec::encode(&owned).expect("encode"),
                "{owned:?}"
            );
            assert_eq!(parts.decode().expect("decodes"), owned);
        }
    }

    #[test]
    fn in_a_larger_value_it_is_its_bytes_behind_their_length() {
        let command = Command::Reset {
            tenant: "acme".into(),
        };
        let encoded = EncodedCommand::encode(&command).expect("encode");
        let outer = codec::encode(&vec![encoded.clone(), encoded.clone()]).expect("encode");
        let own = encoded.as_bytes();
        let mut want = vec![2, u8::try_from(own.len()).expect("short")];
        want.extend_from_slice(own);
        want.push(u8::try_from(own.len()).expect("short"));
        want.extend_from_slice(own);
        assert_eq!(outer, want);
        let back: Vec<EncodedCommand> = codec::decode(&outer).expect("decodes");
        assert_eq!(back, [encoded.clone(), encoded]);
    }

    #[test]
    fn bytes_that_are_no_command_say_so_when_decoded() {
        let garbage = EncodedCommand::from_bytes(Bytes::from_static(&[0xff, 0x01]));
        assert!(garbage.decode().is_err());
        assert!(format!("{garbage:?}").contains("not a command"));
        let trailing = {
            let mut bytes = codec::encode(&Command::Reset { tenant: "t".into() }).expect("encode");
            bytes.push(0);
            EncodedCommand::from_bytes(bytes.into())
        };
        assert!(
            trailing.decode().is_err(),
            "one command, and nothing after it"
        );
    }
}
