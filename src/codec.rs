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

/// Decodes a whole buffer; trailing bytes are an error, not ignored.
///
/// # Errors
/// When the bytes are not exactly one encoded `T`.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (value, read) = bincode::serde::decode_from_slice(bytes, bincode::config::standard())?;
    if read != bytes.len() {
        return Err(CodecError::Trailing {
            trailing_bytes: bytes.len() - read,
        });
    }
    Ok(value)
}
