//! Damaged data dirs: a node's data dir kept aside, damages done to one of its files (cut
//! short, bits flipped, bytes appended), and a start from it that must refuse, naming the
//! file, or serve.

use std::path::{Path, PathBuf};

use super::{Fleet, Start};

/// What a damage does to a file's bytes.
pub type Change = Box<dyn Fn(&mut Vec<u8>)>;

/// What a damaged file must lead to.
#[derive(Clone, Copy, Debug)]
pub enum Expect {
    /// The node exits with status 1 and an error naming the file.
    Refuse,
    /// The node starts, logs this line, and its state is right.
    Recover(&'static str),
    /// Either of those without the line: where a library's own recovery (sled's, redb's)
    /// lands depends on what the damage hits, and both answers are right.
    Either,
}

/// One damage to one file of a data dir.
pub struct Damage {
    pub what: String,
    /// The file, relative to the data dir.
    pub file: PathBuf,
    /// The name a refusal must mention.
    pub names: String,
    pub change: Change,
    pub expect: Expect,
}

impl Damage {
    pub fn new(
        what: impl Into<String>,
        file: &Path,
        expect: Expect,
        change: impl Fn(&mut Vec<u8>) + 'static,
    ) -> Damage {
        // Inside state.sled, sled's files are one store: the error names the store.
        let names = match file.components().next() {
            Some(first) if first.as_os_str() == "state.sled" => "state.sled".to_owned(),
            _ => file
                .file_name()
                .expect("a file")
                .to_string_lossy()
                .into_owned(),
        };
        Damage {
            what: what.into(),
            file: file.to_path_buf(),
            names,
            change: Box::new(change),
            expect,
        }
    }

    /// The file cut to `len` bytes.
    pub fn cut(what: &str, file: &Path, len: usize, expect: Expect) -> Damage {
        Damage::new(format!("{what} (cut to {len})"), file, expect, move |b| {
            b.truncate(len)
        })
    }

    /// One bit flipped in byte `at`.
    pub fn flip(what: &str, file: &Path, at: usize, expect: Expect) -> Damage {
        Damage::new(
            format!("{what} (bit 4 of byte {at})"),
            file,
            expect,
            move |b| b[at] ^= 0x10,
        )
    }
}

/// Where each record of a WAL segment or claim journal starts and ends, in the framing both
/// use (length u32 LE, CRC-32 u32 LE, body), up to a zero length or the end of the file.
pub fn records(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + 8) {
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if len == 0 || at + 8 + len > bytes.len() {
            break;
        }
        found.push((at, at + 8 + len));
        at += 8 + len;
    }
    found
}

/// Where `needle` occurs in `bytes`.
pub fn find_all(bytes: &[u8], needle: &[u8]) -> Vec<usize> {
    bytes
        .windows(needle.len())
        .enumerate()
        .filter(|(_, window)| *window == needle)
        .map(|(at, _)| at)
        .collect()
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("list") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// Stops node `id` cleanly and keeps a copy of its data dir; returns the copy's path.
pub async fn keep_pristine(fleet: &mut Fleet, id: u64) -> PathBuf {
    fleet.stop(id).await;
    let pristine = fleet.dir.path().join(format!("node{id}.pristine"));
    copy_dir(&fleet.data_dir(id), &pristine);
    pristine
}

/// Puts node `id`'s pristine data dir back.
pub fn restore(fleet: &Fleet, id: u64, pristine: &Path) {
    let dir = fleet.data_dir(id);
    std::fs::remove_dir_all(&dir).expect("remove the data dir");
    copy_dir(pristine, &dir);
}

/// The bytes of `file` in node `id`'s pristine copy.
pub fn pristine_bytes(pristine: &Path, file: &Path) -> Vec<u8> {
    std::fs::read(pristine.join(file)).expect("read a pristine file")
}

/// Restores node `id`'s data dir from `pristine`, does `damage` and starts the node. A
/// refusal is checked here (status 1, the file named) and gives `None`; a start gives
/// what the node logged since (checked for the recovery line if one is expected), and the
/// caller checks the state.
pub async fn start_damaged(
    fleet: &mut Fleet,
    id: u64,
    pristine: &Path,
    damage: &Damage,
) -> Option<String> {
    restore(fleet, id, pristine);
    let path = fleet.data_dir(id).join(&damage.file);
    let mut bytes = std::fs::read(&path).expect("read the file to damage");
    (damage.change)(&mut bytes);
    std::fs::write(&path, &bytes).expect("write the damage");
    tracing::info!(what = %damage.what, file = %damage.file.display(), "--- damaged; starting");
    let (start, from) = fleet.restart_watched(id).await;
    match (start, damage.expect) {
        (Start::Exited { status, output }, Expect::Refuse | Expect::Either) => {
            let error = output
                .lines()
                .filter(|line| line.starts_with("Error:"))
                .collect::<Vec<_>>()
                .join("\n");
            if status.code() != Some(1) || !error.contains(&damage.names) {
                fleet.fail(&format!(
                    "{}: exited with {status} and error {error:?}, expected status 1 and an error naming {}",
                    damage.what, damage.names
                ));
            }
            tracing::info!(what = %damage.what, %error, "refused");
            None
        }
        (Start::Exited { status, .. }, Expect::Recover(_)) => fleet.fail(&format!(
            "{}: exited with {status}, expected it to recover",
            damage.what
        )),
        (Start::Serving, Expect::Refuse) => {
            fleet.fail(&format!("{}: started, expected it to refuse", damage.what))
        }
        (Start::Serving, expect) => {
            let log = fleet.log_since(id, from);
            if let Expect::Recover(line) = expect {
                if !log.contains(line) {
                    fleet.fail(&format!(
                        "{}: started without logging {line:?}",
                        damage.what
                    ));
                }
            }
            tracing::info!(what = %damage.what, "started");
            Some(log)
        }
    }
}
