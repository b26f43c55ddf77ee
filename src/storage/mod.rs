//! Disk helpers shared by the stores: the names of a data dir's files ([`layout`]), the record framing of the append-only files
//! ([`record`], used by the WAL and the claim journals) and the sled handle with a real
//! fsync ([`sled_disk`]); and [`unless_panic`], which the stores open their libraries'
//! files through.

pub mod layout;
pub mod record;
pub mod sled_disk;

use std::fs::File;
use std::path::Path;

/// Bytes written between two flushes by [`write_in_flushed_steps`].
pub const FLUSH_STEP_BYTES: u64 = 256 * 1024;

/// Writes bytes `[0, len)` of `file` with `write(file, from, to)`, a [`FLUSH_STEP_BYTES`]
/// step at a time, each step flushed (`fdatasync`) before the next is written.
///
/// For the large writes made beside the log (a snapshot, the zeros of a log segment made
/// ahead): a device flush waits for whatever was written before it, so an append's
/// `fdatasync` that comes meanwhile waits for one step instead of the whole file. In one
/// flush, a node's 27 MB snapshot held every node's appends for 3-12 ms each, and three
/// 16 MiB segments zeroed at once for 23-24 ms (docs/benchmarks.md, round 18).
///
/// # Errors
/// The first error of `write` or of a flush.
pub fn write_in_flushed_steps(
    file: &File,
    len: u64,
    mut write: impl FnMut(&File, u64, u64) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut at = 0;
    while at < len {
        let to = len.min(at + FLUSH_STEP_BYTES);
        write(file, at, to)?;
        file.sync_data()?;
        at = to;
    }
    Ok(())
}

/// fsyncs directory `dir`, so the names created in it survive a power cut (a new file is
/// not durable until its directory entry is).
///
/// # Errors
/// When the directory cannot be opened or synced.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// The mode of the data dir and of every directory in it: only the node's user enters.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// The mode of every file in the data dir: only the node's user reads it (it holds every
/// tenant's state and claims).
pub const PRIVATE_FILE_MODE: u32 = 0o600;
/// The process umask of a serving node, so the files its stores create later (sled's, the
/// journals', the WAL's segments) are private whatever umask it was started with.
pub const PRIVATE_UMASK: libc::mode_t = 0o077;

/// Creates directory `dir` (and missing parents) and gives `dir` itself
/// [`PRIVATE_DIR_MODE`], also when it existed with a wider mode.
///
/// # Errors
/// When the directory cannot be created or its mode set.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR_MODE)
        .create(dir)?;
    // The mode given to `create` is cut by the umask, and an existing directory keeps its
    // own: set it explicitly.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(PRIVATE_DIR_MODE))
}

/// Gives every directory under `dir` [`PRIVATE_DIR_MODE`] and every file
/// [`PRIVATE_FILE_MODE`] (a data dir written by an older version, or under a wide umask).
/// Symbolic links are left alone, not followed.
///
/// # Errors
/// When a directory cannot be read or a mode set.
pub fn make_tree_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let mode = if kind.is_dir() {
                dirs.push(entry.path());
                PRIVATE_DIR_MODE
            } else if kind.is_file() {
                PRIVATE_FILE_MODE
            } else {
                continue;
            };
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(mode))?;
        }
    }
    Ok(())
}

/// Sets the process umask to [`PRIVATE_UMASK`]; a serving node calls it once, before it
/// opens its stores.
pub fn set_private_umask() {
    // SAFETY: umask(2) only swaps the process' file mode creation mask; it cannot fail.
    unsafe { libc::umask(PRIVATE_UMASK) };
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

/// A scratch directory (a benchmark's) removed when this goes out of scope, also on an
/// error.
pub struct RemovedOnDrop(pub std::path::PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    }

    /// A wide existing data dir and what is in it are made private; a new one is born so.
    #[test]
    fn a_data_dir_and_its_files_are_made_private() {
        let root = tempfile::tempdir().expect("tempdir");
        let fresh = root.path().join("fresh").join("data");
        create_private_dir(&fresh).expect("create");
        assert_eq!(mode(&fresh), PRIVATE_DIR_MODE);

        let old = root.path().join("old");
        std::fs::create_dir_all(old.join("state.sled").join("blobs")).expect("mkdir");
        std::fs::write(old.join("raft-log.redb"), b"x").expect("write");
        std::fs::write(old.join("state.sled").join("db"), b"x").expect("write");
        for path in [&old, &old.join("state.sled")] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        std::fs::set_permissions(
            old.join("raft-log.redb"),
            std::fs::Permissions::from_mode(0o644),
        )
        .expect("chmod");
        create_private_dir(&old).expect("tighten");
        make_tree_private(&old).expect("tighten");
        assert_eq!(mode(&old), PRIVATE_DIR_MODE);
        assert_eq!(mode(&old.join("state.sled")), PRIVATE_DIR_MODE);
        assert_eq!(
            mode(&old.join("state.sled").join("blobs")),
            PRIVATE_DIR_MODE
        );
        assert_eq!(mode(&old.join("raft-log.redb")), PRIVATE_FILE_MODE);
        assert_eq!(mode(&old.join("state.sled").join("db")), PRIVATE_FILE_MODE);
    }
}
