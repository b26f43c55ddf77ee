//! Disk helpers shared by the stores: the record framing of the append-only files
//! ([`record`], used by the WAL and the claim journals) and the sled handle with a real
//! fsync ([`sled_disk`]).

pub mod record;
pub mod sled_disk;
