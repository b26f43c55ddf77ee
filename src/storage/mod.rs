//! Disk helpers shared by the stores: the sled handle with a real fsync ([`sled_disk`]).

pub mod sled_disk;
