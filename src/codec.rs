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
