//! Checks of the vote store (the redb file beside the WAL) before the node trusts it: redb's
//! own integrity check, run on a copy, and the vote against the log beside it. Each failure
//! is [`LogStoreError::VoteStore`], naming the file.

use std::path::Path;

use openraft::Vote;
use redb::Database;

use super::{LogStoreError, Result, LOG_CACHE_BYTES};
use crate::raft::{LogId, NodeId};
use crate::storage::unless_panic;

pub(super) fn damaged(path: &Path, reason: String) -> LogStoreError {
    LogStoreError::VoteStore {
        path: path.to_path_buf(),
        reason,
    }
}

/// Checks the vote store at `path` before the node opens it, on a copy beside it.
///
/// redb trusts a file it closed cleanly: it reads whatever its pages hold (a flipped bit in
/// the vote comes back as another vote, or as no vote), and it panics on some damage (a
/// file cut short). `check_integrity` walks every page's checksum, but it also repairs
/// what it can, and a repair can change what the file holds (drop the table, go back to the
/// previous commit): so it runs on a copy, and anything but a clean pass refuses the file,
/// which stays as it was. The file is small (a vote and a purge point): the copy is cheap.
pub(super) fn check_vote_store(path: &Path) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let copy = path.with_extension("redb-check");
    std::fs::copy(path, &copy)
        .map_err(|e| damaged(path, format!("copying it to check it: {e}")))?;
    let checked = unless_panic(|| -> Result<bool, redb::Error> {
        let mut db = Database::builder()
            .set_cache_size(LOG_CACHE_BYTES)
            .create(&copy)?;
        Ok(db.check_integrity()?)
    });
    // A copy left by a crash here is overwritten by the next check.
    let _ = std::fs::remove_file(&copy);
    match checked {
        Ok(Ok(true)) => Ok(()),
        Ok(Ok(false)) => Err(damaged(
            path,
            "redb's integrity check found damage it repairs only by changing the file".to_owned(),
        )),
        Ok(Err(e)) => Err(damaged(path, format!("redb's integrity check: {e}"))),
        Err(panic) => Err(damaged(path, format!("redb panicked: {panic}"))),
    }
}

/// A node saves a vote of term T before it holds an entry of term T (it accepts a leader's
/// entries only after saving that leader's vote, and a leader saves its own first): a vote
/// store whose vote is older than the log beside it lost votes (replaced, emptied, gone back
/// to an earlier commit), and the node could vote twice in a term.
pub(super) fn check_vote_covers_log(
    path: &Path,
    vote: Option<Vote<NodeId>>,
    last_log_id: Option<LogId>,
) -> Result<()> {
    let vote_term = vote.map_or(0, |vote| vote.leader_id().get_term());
    match last_log_id {
        Some(last) if last.leader_id.term > vote_term => Err(damaged(
            path,
            format!(
                "its vote is for term {vote_term} (none: 0), but the log beside it holds entry \
                 {} of term {}: votes were lost",
                last.index, last.leader_id.term
            ),
        )),
        _ => Ok(()),
    }
}
