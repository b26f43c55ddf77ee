//! The one place that turns values into bytes and back (bincode 2 over serde).
//!
//! Log entries, snapshots, Raft RPC payloads and on-disk records all go through here, so
//! the format can be swapped in one module. It must never be used for the public API
//! (that is protobuf, see `proto/`).

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A value could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("encode: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    #[error("decode: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    #[error("decode: {trailing_bytes} trailing bytes")]
    Trailing { trailing_bytes: usize },
}

/// Encodes `value` with the crate's one bincode configuration.
///
/// # Errors
/// Only if serde refuses the value (never for the crate's own types).
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    Ok(bincode::serde::encode_to_vec(
        value,
        bincode::config::standard(),
    )?)
}

/// Encodes `value` behind `front_len` zero bytes (room for a header) into a buffer of
/// exactly the final size: one pass counts the bytes, a second writes them. For large values
/// (snapshots): growing a `Vec` by doubling holds the old and the new buffer at once and
/// leaves up to half of the last one unused.
///
/// # Errors
/// Only if serde refuses the value (never for the crate's own types).
pub fn encode_exact<T: Serialize>(value: &T, front_len: usize) -> Result<Vec<u8>, CodecError> {
    let config = bincode::config::standard();
    let mut size = bincode::enc::write::SizeWriter::default();
    bincode::serde::encode_into_writer(value, &mut size, config)?;
    let mut bytes = vec![0u8; front_len + size.bytes_written];
    let written = bincode::serde::encode_into_slice(value, &mut bytes[front_len..], config)?;
    bytes.truncate(front_len + written);
    Ok(bytes)
}

/// How many bytes `value` encodes to (one counting pass, nothing allocated).
///
/// # Errors
/// Only if serde refuses the value (never for the crate's own types).
pub fn encoded_len<T: Serialize>(value: &T) -> Result<usize, CodecError> {
    let mut size = bincode::enc::write::SizeWriter::default();
    bincode::serde::encode_into_writer(value, &mut size, bincode::config::standard())?;
    Ok(size.bytes_written)
}

/// How many bytes of memory bincode may claim per byte of input. bincode counts what a
/// decoded value takes in memory, not on the wire: a one-byte varint claims its integer's
/// full width (8 bytes for a `u64`, 16 for a `u128`), a byte string claims its length. So a
/// well-formed input never claims more than 16 times its own length, and a length prefix
/// that claims more is refused before anything is allocated for it.
pub const CLAIM_PER_INPUT_BYTE_MAX: u64 = 16;

/// The limits bincode can be given (a const generic): each eight times the one before, so
/// the limit in force is at most eight times the input's own bound.
const LIMIT_TIERS: [u64; 9] = [
    4 << 10,
    32 << 10,
    256 << 10,
    2 << 20,
    16 << 20,
    128 << 20,
    1 << 30,
    8 << 30,
    64 << 30,
];

/// Decodes a whole buffer; trailing bytes are an error, not ignored.
///
/// Never trusts a length read from the bytes: bincode is given a limit of
/// [`CLAIM_PER_INPUT_BYTE_MAX`] times the input's length (rounded up to a tier), so a
/// 13-byte frame whose length prefix claims 2^62 bytes is `LimitExceeded`, not an abort, and
/// no allocation is sized by a claimed length beyond that bound. Every decoder of bytes
/// from a peer or a disk goes through here.
///
/// # Errors
/// When the bytes are not exactly one encoded `T`.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let bound = u64::try_from(bytes.len())
        .unwrap_or(u64::MAX)
        .saturating_mul(CLAIM_PER_INPUT_BYTE_MAX);
    let tier = LIMIT_TIERS
        .iter()
        .position(|limit| *limit >= bound)
        .unwrap_or(LIMIT_TIERS.len() - 1);
    let (value, read) = match tier {
        0 => decode_within::<T, { 4 << 10 }>(bytes)?,
        1 => decode_within::<T, { 32 << 10 }>(bytes)?,
        2 => decode_within::<T, { 256 << 10 }>(bytes)?,
        3 => decode_within::<T, { 2 << 20 }>(bytes)?,
        4 => decode_within::<T, { 16 << 20 }>(bytes)?,
        5 => decode_within::<T, { 128 << 20 }>(bytes)?,
        6 => decode_within::<T, { 1 << 30 }>(bytes)?,
        7 => decode_within::<T, { 8 << 30 }>(bytes)?,
        _ => decode_within::<T, { 64 << 30 }>(bytes)?,
    };
    if read != bytes.len() {
        return Err(CodecError::Trailing {
            trailing_bytes: bytes.len() - read,
        });
    }
    Ok(value)
}

fn decode_within<T: DeserializeOwned, const LIMIT: usize>(
    bytes: &[u8],
) -> Result<(T, usize), CodecError> {
    let config = bincode::config::standard().with_limit::<LIMIT>();
    Ok(bincode::serde::decode_from_slice(bytes, config)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tiers_match_the_limits_decode_uses() {
        // decode's match spells each tier again as a const generic; a tier changed in one
        // place only would decode with a limit nobody meant.
        assert!(LIMIT_TIERS.windows(2).all(|pair| pair[1] == pair[0] * 8));
        assert_eq!(LIMIT_TIERS[0], 4 << 10);
        assert_eq!(LIMIT_TIERS.len(), 9);
    }

    #[test]
    fn a_length_prefix_larger_than_the_input_is_refused_not_allocated() {
        // A byte string claiming 2^62 bytes in a 9-byte input.
        let bytes = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0x40];
        let decoded = decode::<serde_bytes::ByteBuf>(&bytes);
        assert!(
            matches!(
                decoded,
                Err(CodecError::Decode(
                    bincode::error::DecodeError::LimitExceeded
                ))
            ),
            "{decoded:?}"
        );
        let decoded = decode::<String>(&bytes);
        assert!(decoded.is_err(), "{decoded:?}");
    }

    #[test]
    fn values_of_every_width_round_trip_within_their_limit() {
        let wide: Vec<u128> = (0..2_000).map(|n| n % 3).collect();
        assert_eq!(
            decode::<Vec<u128>>(&encode(&wide).expect("encode")).expect("decode"),
            wide
        );
        let words: Vec<String> = (0..2_000).map(|n| n.to_string()).collect();
        assert_eq!(
            decode::<Vec<String>>(&encode(&words).expect("encode")).expect("decode"),
            words
        );
        let bytes = serde_bytes::ByteBuf::from(vec![7u8; 300_000]);
        assert_eq!(
            decode::<serde_bytes::ByteBuf>(&encode(&bytes).expect("encode")).expect("decode"),
            bytes
        );
    }
}
