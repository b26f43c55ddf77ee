//! Replay at open: one segment's records read back and checked, its torn tail zeroed, and
//! the segments checked to follow one another (the rules are in `wal`'s header).

use std::fs::{self, File, OpenOptions};
use std::path::Path;
use std::sync::Arc;

use super::{corrupt, decode_entry, io_error, is_entry, read_record, zero, Segment, Span, State};
use super::{KIND_COMMITTED, KIND_ENTRY};
use crate::raft::log_store::{decode_as, Result};
use crate::raft::LogId;
use crate::storage::record;

/// Replays one segment: its entries (checked) and the newest committed id in it. In the
/// last segment a torn append ends the log and what follows is zeroed; elsewhere, and for
/// any other damage, only zeros may follow the records. A segment shorter than
/// `segment_bytes` was cut short by something else than a crash.
pub(super) fn segment(
    path: &Path,
    first_index: u64,
    is_last: bool,
    segment_bytes: u64,
) -> Result<(Segment, Option<Option<LogId>>)> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| io_error(path, "open", e))?;
    let bytes = fs::read(path).map_err(|e| io_error(path, "read", e))?;
    if (bytes.len() as u64) < segment_bytes {
        return Err(corrupt(
            path,
            format!(
                "{} bytes, shorter than the {segment_bytes} a segment is made with: cut short",
                bytes.len()
            ),
        ));
    }
    let mut spans: Vec<Span> = Vec::new();
    let mut committed = None;
    let mut at = 0;
    // A record whose length or checksum fails is where the log ends (torn or zeros); one
    // that checks but does not fit the log is damage no crash makes: refuse it.
    let misfit = |at: usize, what: String| corrupt(path, format!("record at byte {at}: {what}"));
    while let Some((kind, payload, next)) = read_record(&bytes, at) {
        match kind {
            kind if is_entry(kind) => {
                let entry = decode_entry(kind, payload).map_err(|e| misfit(at, e.to_string()))?;
                let expected = first_index + spans.len() as u64;
                if entry.log_id.index != expected {
                    let got = entry.log_id.index;
                    return Err(misfit(at, format!("entry {got} where {expected} belongs")));
                }
                if let Some(last) = spans.last() {
                    if last.log_id.leader_id > entry.log_id.leader_id {
                        return Err(misfit(at, format!("entry {expected}'s term goes down")));
                    }
                }
                spans.push(Span {
                    offset: at as u64,
                    len: (next - at) as u64,
                    log_id: entry.log_id,
                });
            }
            KIND_COMMITTED => {
                let id = decode_as::<Option<LogId>>(payload, "committed")
                    .map_err(|e| misfit(at, e.to_string()))?;
                committed = Some(id);
            }
            other => {
                let newer = if other > KIND_ENTRY {
                    " (written by a newer version?)"
                } else {
                    ""
                };
                return Err(misfit(at, format!("unknown kind {other}{newer}")));
            }
        }
        at = next;
    }
    check_tail(&file, path, &bytes, at, is_last)?;
    let segment = Segment {
        first_index,
        path: path.to_path_buf(),
        file: Arc::new(file),
        end: at as u64,
        spans,
    };
    Ok((segment, committed))
}

/// What follows a segment's last good record at `at`: zeros, or in the last segment a torn
/// append or an unfinished truncation, which is zeroed; anything else is damage.
fn check_tail(file: &File, path: &Path, bytes: &[u8], at: usize, is_last: bool) -> Result<()> {
    let rest_is_zero = bytes[at..].iter().all(|byte| *byte == 0);
    if !rest_is_zero {
        if !is_last {
            return Err(corrupt(
                path,
                format!("unreadable record at byte {at} of a segment that is not the last"),
            ));
        }
        // Truncation (and the zeroing of a torn tail) zeroes forward from a record
        // boundary and fsyncs at the end: a crash part way leaves a whole zero header at
        // the cut with stale records after it. Those were being cut; what is before stays.
        // (One flipped bit cannot zero a whole header.)
        let unfinished_cut = bytes
            .get(at..at + record::HEADER_BYTES)
            .is_some_and(|header| header.iter().all(|byte| *byte == 0));
        if !unfinished_cut && !record::is_torn_append(&bytes[at..], at as u64, bytes.len()) {
            return Err(corrupt(
                path,
                format!(
                    "damaged record at byte {at}: not a torn append (data in every sector of \
                     it, or after it), so it may hold acknowledged entries"
                ),
            ));
        }
        tracing::warn!(path = %path.display(), at, unfinished_cut, "log ends in a torn append or an unfinished truncation; zeroing it");
        zero(file, path, at as u64, bytes.len() as u64)?;
        file.sync_data().map_err(|e| io_error(path, "fsync", e))?;
    }
    Ok(())
}

/// Each segment must start right after the one before it ends.
pub(super) fn check_contiguous(dir: &Path, state: &State) -> Result<()> {
    let mut expected: Option<u64> = None;
    for segment in state.segments.values() {
        if let Some(expected) = expected.filter(|want| *want != segment.first_index) {
            return Err(corrupt(
                dir,
                format!(
                    "segment starting at {} follows one ending before {expected}: a hole",
                    segment.first_index
                ),
            ));
        }
        expected = Some(segment.next_index());
    }
    Ok(())
}
