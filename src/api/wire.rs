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

/// Decodes `U`; a failure becomes `INVALID_ARGUMENT` with the field's path.
#[derive(Debug, Clone, Default)]
pub struct FieldNamingDecoder<U> {
    _type: PhantomData<U>,
}

impl<U: Message + Default + Send + 'static> Decoder for FieldNamingDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        if let Some(limit) = edge_request_bytes_max::<U>() {
            if buf.remaining() > limit {
                // The words tonic's own transport limit uses, so a caller sees one refusal.
                return Err(Status::out_of_range(format!(
                    "Error, decoded message length too large: found {} bytes, the limit is: {limit} bytes",
                    buf.remaining()
                )));
            }
        }
        let bytes = buf.copy_to_bytes(buf.remaining());
        match U::decode(bytes.clone()) {
            Ok(message) => Ok(Some(message)),
            Err(e) => Err(Status::invalid_argument(describe(&e.to_string(), &bytes))),
        }
    }
}

/// The limit of one `Fleet` request other than `HitBatch`'s: the `Fleet` service's
/// transport limit is a `HitBatch` frame's ([`crate::limits::HIT_BATCH_MESSAGE_BYTES_MAX`]),
/// and one hit, settle, reset or check stays within
/// [`crate::limits::API_MESSAGE_BYTES_MAX`]. `None` for every other message (the peers'
/// and the answers): their service's transport limit holds them.
fn edge_request_bytes_max<U: 'static>() -> Option<usize> {
    use std::any::TypeId;
    let single = [
        TypeId::of::<pb::HitRequest>(),
        TypeId::of::<pb::SettleRequest>(),
        TypeId::of::<pb::ResetRequest>(),
        TypeId::of::<pb::CheckRateRequest>(),
        TypeId::of::<pb::StatusRequest>(),
    ];
    single
        .contains(&TypeId::of::<U>())
        .then_some(crate::limits::API_MESSAGE_BYTES_MAX)
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
    if parts[path_len - 1] == "HitRequest.charges" {
        if let Some(index) = first_bad_charge(bytes.clone()) {
            fields[0] = format!("charges[{index}]");
        }
    }
    format!("{}: {}", fields.join("."), parts[path_len..].join(": "))
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
    fn garbage_names_the_request() {
        assert!(describe(
            "failed to decode Protobuf message: invalid wire type value: 7",
            &Bytes::new()
        )
        .starts_with("request: "));
    }
}
