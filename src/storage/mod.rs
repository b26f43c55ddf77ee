//! Disk helpers shared by the stores: the record framing of the append-only files
//! ([`record`], used by the WAL and the claim journals) and the sled handle with a real
//! fsync ([`sled_disk`]); and [`unless_panic`], which the stores open their libraries'
//! files through.

pub mod record;
pub mod sled_disk;

use std::path::Path;

/// fsyncs directory `dir`, so the names created in it survive a power cut (a new file is
/// not durable until its directory entry is).
///
/// # Errors
/// When the directory cannot be opened or synced.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// The directory that holds `path`: its parent, or `.` for a bare name.
pub fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Runs `work`, a library's open or read of a file, and turns a panic into its message:
/// redb panics on some damage (a file cut short), and a damaged file must give the node an
/// error naming it, never a crash.
///
/// # Errors
/// The panic's message, when `work` panicked.
pub fn unless_panic<T>(work: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|message| (*message).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic with no message".to_owned())
    })
}
