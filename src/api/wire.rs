//! The gRPC codec of every service: prost encoding, but a request that does not decode is
//! bad input, so it answers `INVALID_ARGUMENT` naming the field (contract §9) instead of
//! tonic's default `INTERNAL`. The typical case is an id that is not UTF-8, which protobuf
//! refuses before any handler (and `api::validate`) runs.

use std::marker::PhantomData;

use bytes::{Buf, Bytes};
use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstEncoder};

use crate::limits::{API_MESSAGE_BYTES_MAX, HIT_BATCH_HITS_MAX};
use crate::pb;

/// prost encoding, field-naming decode errors.
#[derive(Debug, Clone, Default)]
pub struct FleetCodec<T, U> {
    _types: PhantomData<(T, U)>,
}

impl<T, U> Codec for FleetCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = FieldNamingDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        FieldNamingDecoder { _type: PhantomData }
    }
}

/// A request message the codec refuses (its codes are in `api::status`).
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The message does not decode; `described` names the field (see [`describe`]).
    #[error("{described}")]
    Undecodable {
        described: String,
        #[source]
        source: prost::DecodeError,
    },
    /// A `HitBatch` message of more than [`HIT_BATCH_HITS_MAX`] hits.
    #[error("hits: more than {HIT_BATCH_HITS_MAX} hits in one message")]
    TooManyHits,
    /// A hit of a `HitBatch` message over one hit's limit, [`API_MESSAGE_BYTES_MAX`].
    #[error("hits[{index}].hit: {bytes} bytes, the limit is: {API_MESSAGE_BYTES_MAX} bytes")]
    HitTooLarge { index: usize, bytes: usize },
}

/// Decodes `U`; a failure becomes `INVALID_ARGUMENT` with the field's path.
#[derive(Debug, Clone, Default)]
pub struct FieldNamingDecoder<U> {
    _type: PhantomData<U>,
}

impl<U: Message + Default + Send + 'static> Decoder for FieldNamingDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        if std::any::TypeId::of::<U>() == std::any::TypeId::of::<pb::HitBatchRequest>() {
            check_frame(buf.chunk())?;
        }
        let bytes = buf.copy_to_bytes(buf.remaining());
        match U::decode(bytes.clone()) {
            Ok(message) => Ok(Some(message)),
            Err(source) => Err(WireError::Undecodable {
                described: describe(&source.to_string(), &bytes),
                source,
            }
            .into()),
        }
    }
}

/// A `HitBatch` message's own rules, read from its bytes before it is decoded: at most
/// [`HIT_BATCH_HITS_MAX`] hits, and each hit within one hit's limit,
/// [`API_MESSAGE_BYTES_MAX`]. A message that breaks one is refused whole and ends the
/// stream, as a unary request over its limit is refused by the transport, so a large
/// message of tiny hits costs one refusal, not one per hit. Bytes that do not parse are
/// left to prost's decode, which names what is wrong.
fn check_frame(bytes: &[u8]) -> Result<(), WireError> {
    let mut hits = 0usize;
    each_field(bytes, |field, value| {
        // HitBatchRequest.hits = 1, a BatchedHit.
        let (1, Some(batched)) = (field, value) else {
            return Ok(());
        };
        if hits == HIT_BATCH_HITS_MAX {
            return Err(WireError::TooManyHits);
        }
        let index = hits;
        hits += 1;
        each_field(batched, |field, value| match (field, value) {
            // BatchedHit.hit = 2, the HitRequest.
            (2, Some(hit)) if hit.len() > API_MESSAGE_BYTES_MAX => Err(WireError::HitTooLarge {
                index,
                bytes: hit.len(),
            }),
            _ => Ok(()),
        })
    })
}

/// Calls `visit` with each top-level field of a protobuf message: its number, and its
/// bytes when it is length-delimited. Stops quietly where the bytes do not parse, and at
/// the first error of `visit`.
fn each_field<E>(
    mut bytes: &[u8],
    mut visit: impl FnMut(u64, Option<&[u8]>) -> Result<(), E>,
) -> Result<(), E> {
    while bytes.has_remaining() {
        let Ok(key) = prost::encoding::decode_varint(&mut bytes) else {
            return Ok(());
        };
        let (field, wire_type) = (key >> 3, key & 0x7);
        let skip = match wire_type {
            0 => match prost::encoding::decode_varint(&mut bytes) {
                Ok(_) => 0,
                Err(_) => return Ok(()),
            },
            1 => 8,
            2 => match prost::encoding::decode_varint(&mut bytes) {
                Ok(len) => usize::try_from(len).unwrap_or(usize::MAX),
                Err(_) => return Ok(()),
            },
            5 => 4,
            _ => return Ok(()),
        };
        if skip > bytes.remaining() {
            return Ok(());
        }
        let (value, rest) = bytes.split_at(skip);
        visit(field, (wire_type == 2).then_some(value))?;
        bytes = rest;
    }
    Ok(())
}

/// Turns prost's "failed to decode Protobuf message: Claim.key: HitRequest.claim: invalid
/// string value: ..." into "claim.key: invalid string value: ...". prost lists the path
/// innermost first as `Message.field`; a repeated field gets its index from the bytes.
pub fn describe(prost_message: &str, bytes: &Bytes) -> String {
    let detail = prost_message
        .strip_prefix("failed to decode Protobuf message: ")
        .unwrap_or(prost_message);
    let parts: Vec<&str> = detail.split(": ").collect();
    let path_len = parts
        .iter()
        .take_while(|part| !part.contains(' ') && part.contains('.'))
        .count();
    if path_len == 0 {
        return format!("request: {detail}");
    }
    let mut fields: Vec<String> = parts[..path_len]
        .iter()
        .rev()
        .filter_map(|part| part.split_once('.').map(|(_, field)| field.to_owned()))
        .collect();
    // The hit a bad charge is in: the request, or the first hit of a frame that does not
    // decode (whose id is named too: the edge matches answers by it).
    let mut hit = Some(bytes.clone());
    if parts[path_len - 1] == "HitBatchRequest.hits" {
        hit = None;
        if let Some((index, id, hit_bytes)) = first_bad_hit(bytes) {
            fields[0] = match id {
                Some(id) => format!("hits[{index}] (id {id})"),
                None => format!("hits[{index}]"),
            };
            hit = hit_bytes;
        }
    }
    if let (Some(at), Some(hit)) = (
        parts[..path_len]
            .iter()
            .rev()
            .position(|part| *part == "HitRequest.charges"),
        hit,
    ) {
        if let Some(index) = first_bad_charge(hit) {
            fields[at] = format!("charges[{index}]");
        }
    }
    format!("{}: {}", fields.join("."), parts[path_len..].join(": "))
}

/// The first hit of a `HitBatch` message that does not decode: its index, its id when that
/// can be read, and its `HitRequest`'s bytes when they can be found.
fn first_bad_hit(bytes: &Bytes) -> Option<(usize, Option<u64>, Option<Bytes>)> {
    let mut index = 0;
    let mut found = None;
    let _ = each_field(bytes, |field, value| {
        let (1, Some(batched)) = (field, value) else {
            return Ok(());
        };
        if pb::BatchedHit::decode(batched).is_ok() {
            index += 1;
            return Ok(());
        }
        let mut hit = None;
        let _ = each_field(batched, |field, value| {
            if let (2, Some(request)) = (field, value) {
                hit = Some(Bytes::copy_from_slice(request));
            }
            Ok::<(), ()>(())
        });
        found = Some((index, id_of(batched), hit));
        // Stops the walk: the first bad hit is the one prost named.
        Err(())
    });
    found
}

/// A `BatchedHit`'s id (field 1, a varint), read on its own.
fn id_of(batched: &[u8]) -> Option<u64> {
    let mut bytes = batched;
    while bytes.has_remaining() {
        let key = prost::encoding::decode_varint(&mut bytes).ok()?;
        let value = match key & 0x7 {
            0 => prost::encoding::decode_varint(&mut bytes).ok()?,
            2 => {
                let len = usize::try_from(prost::encoding::decode_varint(&mut bytes).ok()?).ok()?;
                bytes = bytes.get(len..)?;
                continue;
            }
            1 => {
                bytes = bytes.get(8..)?;
                continue;
            }
            5 => {
                bytes = bytes.get(4..)?;
                continue;
            }
            _ => return None,
        };
        if key >> 3 == 1 {
            return Some(value);
        }
    }
    None
}

/// The index of the first `charges` entry (field 1 of HitRequest) that does not decode.
fn first_bad_charge(mut bytes: Bytes) -> Option<usize> {
    let mut index = 0;
    while bytes.has_remaining() {
        let key = prost::encoding::decode_varint(&mut bytes).ok()?;
        let (field, wire_type) = (key >> 3, key & 0x7);
        let skip = match wire_type {
            0 => {
                prost::encoding::decode_varint(&mut bytes).ok()?;
                0
            }
            1 => 8,
            2 => usize::try_from(prost::encoding::decode_varint(&mut bytes).ok()?).ok()?,
            5 => 4,
            _ => return None,
        };
        if skip > bytes.remaining() {
            return None;
        }
        let value = bytes.split_to(skip);
        if field == 1 && wire_type == 2 {
            if pb::Charge::decode(value).is_err() {
                return Some(index);
            }
            index += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_paths_read_outermost_first() {
        let message = "failed to decode Protobuf message: Claim.key: HitRequest.claim: invalid string value: data is not UTF-8 encoded";
        assert_eq!(
            describe(message, &Bytes::new()),
            "claim.key: invalid string value: data is not UTF-8 encoded"
        );
    }

    #[test]
    fn a_repeated_field_gets_its_index() {
        let good = pb::Charge {
            kind: 1,
            tenant: "a".to_owned(),
            increment_us: 1,
            capacity_us: 1,
        };
        let mut bytes = pb::HitRequest {
            charges: vec![good.clone(), good],
            ..Default::default()
        }
        .encode_to_vec();
        // Third charge: field 1, length 3, holding field 2 (tenant) = one byte 0x80.
        bytes.extend_from_slice(&[0x0a, 0x03, 0x12, 0x01, 0x80]);
        let error = pb::HitRequest::decode(bytes.as_slice()).expect_err("not UTF-8");
        let described = describe(&error.to_string(), &Bytes::from(bytes));
        assert!(described.starts_with("charges[2].tenant: "), "{described}");
    }

    #[test]
    fn a_bad_hit_in_a_frame_is_named_by_its_index_and_id() {
        let good = pb::BatchedHit {
            id: 7,
            hit: Some(pb::HitRequest::default()),
        };
        let mut bytes = pb::HitBatchRequest {
            hits: vec![good.clone(), good],
        }
        .encode_to_vec();
        // Third hit: id 42, then a HitRequest whose second charge's tenant is 0x80.
        let charge = [0x0a, 0x03, 0x12, 0x01, b'a'];
        let bad_charge = [0x0a, 0x03, 0x12, 0x01, 0x80];
        let hit: Vec<u8> = [charge, bad_charge].concat();
        let mut batched = vec![0x08, 42, 0x12, hit.len() as u8];
        batched.extend_from_slice(&hit);
        bytes.push(0x0a);
        bytes.push(batched.len() as u8);
        bytes.extend_from_slice(&batched);
        let error = pb::HitBatchRequest::decode(bytes.as_slice()).expect_err("not UTF-8");
        let described = describe(&error.to_string(), &Bytes::from(bytes));
        assert!(
            described.starts_with("hits[2] (id 42).hit.charges[1].tenant: "),
            "{described}"
        );
    }

    #[test]
    fn a_frame_over_its_hit_count_or_with_a_hit_over_its_limit_is_refused_unread() {
        let hit = |bytes: usize| pb::BatchedHit {
            id: 1,
            hit: Some(pb::HitRequest {
                claim: Some(pb::Claim {
                    key: "k".repeat(bytes),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };
        let frame = |hits: Vec<pb::BatchedHit>| pb::HitBatchRequest { hits }.encode_to_vec();
        let full = frame(vec![hit(1); HIT_BATCH_HITS_MAX]);
        assert!(check_frame(&full).is_ok());
        let over = frame(vec![hit(1); HIT_BATCH_HITS_MAX + 1]);
        let refused = Status::from(check_frame(&over).expect_err("one hit too many"));
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(refused.message().starts_with("hits: "), "{refused:?}");
        // A claim key of n bytes (under 2^14) makes a hit of n + 6: two tags, two lengths.
        let at_limit = frame(vec![hit(1), hit(API_MESSAGE_BYTES_MAX - 6)]);
        assert!(check_frame(&at_limit).is_ok());
        let past = frame(vec![hit(1), hit(API_MESSAGE_BYTES_MAX)]);
        let refused = Status::from(check_frame(&past).expect_err("a hit over its limit"));
        assert_eq!(refused.code(), tonic::Code::OutOfRange);
        assert!(
            refused.message().starts_with("hits[1].hit: ")
                && refused
                    .message()
                    .contains(&format!("the limit is: {API_MESSAGE_BYTES_MAX} bytes")),
            "{refused:?}"
        );
    }

    #[test]
    fn garbage_names_the_request() {
        assert!(describe(
            "failed to decode Protobuf message: invalid wire type value: 7",
            &Bytes::new()
        )
        .starts_with("request: "));
    }
}
