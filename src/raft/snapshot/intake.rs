//! The receiving end of a snapshot sent in chunks (the Peer `InstallSnapshot` call): it
//! gathers the chunks of one snapshot and checks the whole of it before openraft sees any
//! of it. A snapshot that fails to install stops its Raft core (`core_call fatal error`), so
//! what reaches openraft must be one the install takes: it decodes with [`super::decode`],
//! the decoder `install_snapshot` uses, and its meta fits its body and its sender's vote.
//!
//! Memory: the intake holds the bytes received of one snapshot, at most
//! [`SNAPSHOT_BYTES_MAX`], growing only with bytes a peer really sent (a chunk is admitted
//! only at or before what arrived). When the last chunk is in, that buffer is moved (not
//! copied) to openraft (`Raft::install_full_snapshot`), which hands it to the state
//! machine; openraft's own chunk receiver, which would keep a second copy, is not used. The
//! check decodes the body once, and drops it before the install decodes it again: at its
//! peak a node holds the bytes and one decoded state, as the install alone does.
//!
//! It never installs anything itself and never touches a disk.

use std::io::Cursor;
use std::sync::Mutex;

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{InstallSnapshotRequest, InstallSnapshotResponse};
use openraft::Vote;

use crate::lock::lock;
use crate::raft::{NodeId, Raft, Snapshot, SnapshotMeta, TypeConfig};

/// The largest snapshot a node receives.
/// 4 GiB: `codec::decode`'s largest tier (64 GiB) covers 16 times that, so a snapshot this
/// node admits is one it can also decode.
pub const SNAPSHOT_BYTES_MAX: u64 = 4 << 30;

/// A chunk or a whole snapshot this node does not take: `field` names the part of the
/// `InstallSnapshot` request at fault (answered `INVALID_ARGUMENT`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct SnapshotRefused {
    pub field: &'static str,
    pub reason: String,
}

fn refused(field: &'static str, reason: impl Into<String>) -> SnapshotRefused {
    SnapshotRefused {
        field,
        reason: reason.into(),
    }
}

/// The snapshot being received: its id, the bytes of it that arrived, and when the last
/// chunk did.
#[derive(Default)]
pub struct SnapshotIntake {
    snapshot_id: String,
    data: Vec<u8>,
    last_chunk_at: Option<std::time::Instant>,
}

/// A transfer with no chunk for this long is abandoned (its leader died mid-way, or the
/// node caught up from the log instead) and its bytes are let go. openraft's sender retries
/// a chunk within seconds.
pub const INTAKE_ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Lets go of `intake`'s bytes once no chunk came for [`INTAKE_ABANDONED_AFTER`], checking
/// every tenth of that; ends when the intake is dropped.
pub fn sweep_abandoned(intake: &std::sync::Arc<Mutex<SnapshotIntake>>) {
    let intake = std::sync::Arc::downgrade(intake);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(INTAKE_ABANDONED_AFTER / 10).await;
            let Some(intake) = intake.upgrade() else {
                return;
            };
            lock(&intake).drop_if_abandoned(std::time::Instant::now());
        }
    });
}

impl SnapshotIntake {
    /// Lets go of a transfer whose last chunk came [`INTAKE_ABANDONED_AFTER`] before `now`;
    /// true if there was one.
    pub fn drop_if_abandoned(&mut self, now: std::time::Instant) -> bool {
        let abandoned = self
            .last_chunk_at
            .is_some_and(|at| now.saturating_duration_since(at) >= INTAKE_ABANDONED_AFTER);
        if abandoned {
            tracing::info!(snapshot_id = ?self.snapshot_id, bytes = self.data.len(), "an abandoned snapshot transfer let go");
            *self = Self::default();
        }
        abandoned
    }

    /// Admits a chunk that starts a snapshot (offset 0) or continues the current one at or
    /// before its end, within [`SNAPSHOT_BYTES_MAX`]. A chunk sent again (a retry) is
    /// admitted; only its bytes past what arrived are kept. The last chunk (`done`) ends
    /// the snapshot: its bytes are returned, unchecked ([`check_received`] is the check).
    ///
    /// # Errors
    /// The field that is out of bounds.
    pub fn admit(
        &mut self,
        snapshot_id: &str,
        offset: u64,
        data: &[u8],
        done: bool,
    ) -> Result<Option<Vec<u8>>, SnapshotRefused> {
        let end = u64::try_from(data.len())
            .ok()
            .and_then(|len| offset.checked_add(len))
            .filter(|end| *end <= SNAPSHOT_BYTES_MAX)
            .ok_or_else(|| {
                refused(
                    "offset",
                    format!("a chunk ending past {SNAPSHOT_BYTES_MAX} bytes"),
                )
            })?;
        if offset == 0 {
            *self = Self {
                snapshot_id: snapshot_id.to_owned(),
                ..Self::default()
            };
        } else if snapshot_id != self.snapshot_id {
            return Err(refused(
                "meta.snapshot_id",
                format!("`{snapshot_id}` was not started with a chunk at offset 0"),
            ));
        }
        let received_bytes = self.data.len() as u64;
        let Some(seen) = received_bytes.checked_sub(offset) else {
            return Err(refused(
                "offset",
                format!(
                    "{offset} is past the {received_bytes} bytes received of snapshot \
                     `{snapshot_id}`"
                ),
            ));
        };
        if end > received_bytes {
            // `end` is within SNAPSHOT_BYTES_MAX, so `seen` is below `data.len()`.
            let fresh = &data[usize::try_from(seen).unwrap_or(usize::MAX).min(data.len())..];
            self.grow_for(fresh.len());
            self.data.extend_from_slice(fresh);
        }
        if !done {
            self.last_chunk_at = Some(std::time::Instant::now());
            return Ok(None);
        }
        Ok(Some(std::mem::take(self).data))
    }

    /// Makes room for `more` bytes: doubling, as a `Vec` does, but never past the size the
    /// snapshot's header declares once that is in. An honest snapshot ends in a buffer of
    /// exactly its size; a header alone reserves nothing, so memory still follows the bytes
    /// that arrived (at most twice them).
    fn grow_for(&mut self, more: usize) {
        let wanted = self.data.len().saturating_add(more);
        if wanted <= self.data.capacity() {
            return;
        }
        let doubled = self.data.capacity().saturating_mul(2).max(wanted);
        let target = match declared_bytes(&self.data) {
            Some(total) if total >= wanted => doubled.min(total),
            _ => doubled,
        };
        self.data.reserve_exact(target - self.data.len());
    }
}

/// The whole size a snapshot's header declares (header and body), if the header is in.
fn declared_bytes(data: &[u8]) -> Option<usize> {
    let body = data.get(8..16)?;
    let mut len = [0u8; 8];
    len.copy_from_slice(body);
    usize::try_from(u64::from_le_bytes(len))
        .ok()?
        .checked_add(super::HEADER_LEN)
}

/// Checks a whole received snapshot before it goes to openraft: everything its install
/// would choke on. Its meta first (cheap): what it covers is within its sender's term, its
/// membership is no later than what it covers, and a snapshot that covers anything has a
/// membership with a voter in every config and an address for every voter. Then its bytes,
/// with [`super::decode`] (header, length, CRC-32, body), and the body must cover what the
/// meta says (a restart reads the body, an install the meta: they must agree).
///
/// # Errors
/// The field at fault: `meta.last_log_id`, `meta.last_membership` (or their parts) or
/// `data`.
pub fn check_received(
    vote: &Vote<NodeId>,
    meta: &SnapshotMeta,
    data: &[u8],
) -> Result<(), SnapshotRefused> {
    let covered = meta.last_log_id;
    if let Some(log_id) = covered {
        let vote_term = vote.leader_id.term;
        if log_id.leader_id.term > vote_term {
            return Err(refused(
                "meta.last_log_id.term",
                format!(
                    "{} is past the term of the sender's vote, {vote_term}",
                    log_id.leader_id.term
                ),
            ));
        }
    }
    if meta.last_membership.log_id() > &covered {
        return Err(refused(
            "meta.last_membership.log_id",
            format!(
                "{:?} is past meta.last_log_id {covered:?}",
                meta.last_membership.log_id()
            ),
        ));
    }
    if covered.is_some() {
        check_membership(meta)?;
    }
    let body = super::decode(data).map_err(|e| {
        refused(
            "data",
            format!("the received snapshot does not decode: {e}"),
        )
    })?;
    if body.last_applied != covered {
        return Err(refused(
            "meta.last_log_id",
            format!(
                "{covered:?}, but the snapshot's body covers {:?}",
                body.last_applied
            ),
        ));
    }
    if body.membership != meta.last_membership {
        return Err(refused(
            "meta.last_membership",
            format!(
                "{:?}, but the snapshot's body holds {:?}",
                meta.last_membership, body.membership
            ),
        ));
    }
    Ok(())
}

/// The membership a snapshot installs becomes the node's: every config needs a voter and
/// every voter an address (openraft's own rule for a membership it makes).
fn check_membership(meta: &SnapshotMeta) -> Result<(), SnapshotRefused> {
    let membership = meta.last_membership.membership();
    let configs = membership.get_joint_config();
    if configs.is_empty() || configs.iter().any(|config| config.is_empty()) {
        return Err(refused(
            "meta.last_membership",
            format!("a config without voters: {configs:?}"),
        ));
    }
    if let Some(voter) = membership
        .voter_ids()
        .find(|voter| membership.get_node(voter).is_none())
    {
        return Err(refused(
            "meta.last_membership",
            format!("voter {voter} has no node (no address)"),
        ));
    }
    Ok(())
}

/// What openraft answers an `InstallSnapshot` call.
pub type InstallSnapshotAnswer =
    Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;

/// Receives one chunk for `raft`, as openraft's `Raft::install_snapshot` would, but with
/// this node's intake in place of openraft's chunk receiver. A chunk under this node's vote
/// is answered with the vote and not kept (openraft's rule). The last chunk's snapshot is
/// checked whole ([`check_received`], off the async threads) and only then installed.
///
/// # Errors
/// A chunk or snapshot this node does not take; nothing of it reached openraft.
pub async fn receive(
    raft: &Raft,
    intake: &Mutex<SnapshotIntake>,
    request: InstallSnapshotRequest<TypeConfig>,
) -> Result<InstallSnapshotAnswer, SnapshotRefused> {
    let my_vote = match raft.with_raft_state(|state| *state.vote_ref()).await {
        Ok(vote) => vote,
        Err(fatal) => return Ok(Err(RaftError::Fatal(fatal))),
    };
    let answer = InstallSnapshotResponse { vote: my_vote };
    if !matches!(
        request.vote.partial_cmp(&my_vote),
        Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal)
    ) {
        tracing::debug!(vote = %request.vote, %my_vote, "snapshot chunk under this node's vote, not kept");
        return Ok(Ok(answer));
    }
    let InstallSnapshotRequest {
        vote,
        meta,
        offset,
        data,
        done,
    } = request;
    let whole = lock(intake).admit(&meta.snapshot_id, offset, &data, done);
    drop(data);
    let Some(whole) = whole.inspect_err(|e| warn_refused(&meta, e))? else {
        return Ok(Ok(answer));
    };
    let (checked, whole, meta) =
        tokio::task::spawn_blocking(move || (check_received(&vote, &meta, &whole), whole, meta))
            .await
            .map_err(|e| refused("data", format!("the check of the snapshot failed: {e}")))?;
    if let Err(e) = checked {
        warn_refused(&meta, &e);
        return Err(e);
    }
    let snapshot = Snapshot {
        meta,
        snapshot: Box::new(Cursor::new(whole)),
    };
    Ok(match raft.install_full_snapshot(vote, snapshot).await {
        Ok(installed) => Ok(installed.into()),
        Err(fatal) => Err(RaftError::Fatal(fatal)),
    })
}

fn warn_refused(meta: &SnapshotMeta, refused: &SnapshotRefused) {
    metrics::counter!("ankusa_snapshots_total", "event" => "refused").increment(1);
    tracing::warn!(snapshot_id = ?meta.snapshot_id, error = %refused, "refused a snapshot");
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use openraft::{CommittedLeaderId, Membership};

    use super::*;
    use crate::raft::snapshot::{encode, SnapshotBody, HEADER_LEN};
    use crate::raft::{LogId, MemberNode, StoredMembership};

    fn chunks_of(snapshot: &[u8], size: usize) -> Vec<(u64, &[u8], bool)> {
        let count = snapshot.chunks(size).count();
        snapshot
            .chunks(size)
            .enumerate()
            .map(|(i, chunk)| ((i * size) as u64, chunk, i + 1 == count))
            .collect()
    }

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn members() -> StoredMembership {
        let nodes = BTreeMap::from([(1, MemberNode::default()), (2, MemberNode::default())]);
        StoredMembership::new(Some(log_id(1, 1)), Membership::from(nodes))
    }

    /// A snapshot of an empty state covering index 7 of term 2, as a node builds one, and
    /// its meta.
    fn a_snapshot() -> (SnapshotMeta, Vec<u8>) {
        let body = SnapshotBody {
            last_applied: Some(log_id(2, 7)),
            membership: members(),
            ..SnapshotBody::default()
        };
        let meta = SnapshotMeta {
            last_log_id: body.last_applied,
            last_membership: body.membership.clone(),
            snapshot_id: "s1".to_owned(),
        };
        (meta, encode(&body).expect("encode"))
    }

    fn vote() -> Vote<NodeId> {
        Vote::new_committed(2, 1)
    }

    /// `body` behind a header whose magic, version, length and CRC-32 are all right.
    fn sealed_garbage(body: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(HEADER_LEN + body.len());
        bytes.extend_from_slice(b"AKFS");
        bytes.extend_from_slice(&super::super::FORMAT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        bytes.extend_from_slice(body);
        bytes
    }

    fn received(intake: &mut SnapshotIntake, snapshot: &[u8], size: usize) -> Vec<u8> {
        let mut whole = None;
        for (offset, chunk, done) in chunks_of(snapshot, size) {
            whole = intake.admit("s1", offset, chunk, done).expect("admitted");
        }
        whole.expect("the last chunk returns the snapshot")
    }

    #[test]
    fn a_good_snapshot_arrives_whole_in_a_buffer_of_its_size_and_checks() {
        let (meta, snapshot) = a_snapshot();
        let mut intake = SnapshotIntake::default();
        let chunks = chunks_of(&snapshot, 7);
        let mut whole = None;
        for (n, (offset, chunk, done)) in chunks.iter().enumerate() {
            whole = intake.admit("s1", *offset, chunk, *done).expect("admitted");
            if n == 2 {
                // openraft resends a chunk whose answer it did not get.
                let (offset, chunk, _) = chunks[1];
                assert_eq!(intake.admit("s1", offset, chunk, false), Ok(None));
            }
        }
        let whole = whole.expect("whole");
        assert_eq!(whole, snapshot);
        assert_eq!(
            whole.capacity(),
            snapshot.len(),
            "grown past its header's size"
        );
        assert_eq!(check_received(&vote(), &meta, &whole), Ok(()));
        // The intake is empty again: a chunk past offset 0 starts nothing.
        let err = intake.admit("s1", 7, b"x", true).expect_err("ended");
        assert_eq!(err.field, "meta.snapshot_id");
    }

    #[test]
    fn an_abandoned_transfer_is_let_go_after_its_time() {
        let (_, snapshot) = a_snapshot();
        let mut intake = SnapshotIntake::default();
        let now = std::time::Instant::now();
        assert!(!intake.drop_if_abandoned(now), "nothing to let go");
        intake
            .admit("s1", 0, &snapshot[..10], false)
            .expect("first");
        assert!(!intake.drop_if_abandoned(std::time::Instant::now()));
        assert_eq!(intake.data.len(), 10);
        assert!(intake.drop_if_abandoned(now + INTAKE_ABANDONED_AFTER + INTAKE_ABANDONED_AFTER));
        assert!(intake.data.is_empty() && intake.data.capacity() == 0);
        let err = intake
            .admit("s1", 10, &snapshot[10..], true)
            .expect_err("let go");
        assert_eq!(err.field, "meta.snapshot_id");
    }

    /// The forged snapshot that stopped a Raft core: header, length and CRC right, a body
    /// of 64 garbage bytes. The intake takes its chunks; the check refuses it by its field.
    #[test]
    fn a_garbage_body_under_a_right_header_is_refused_as_data() {
        let (meta, _) = a_snapshot();
        for garbage in [vec![0xab; 64], vec![0xff; 64], (0..64).collect::<Vec<u8>>()] {
            let forged = sealed_garbage(&garbage);
            let whole = received(&mut SnapshotIntake::default(), &forged, 30);
            let err = check_received(&vote(), &meta, &whole).expect_err("garbage");
            assert_eq!(err.field, "data", "{err}");
            assert!(err.to_string().starts_with("data: "), "{err}");
        }
        // A flipped bit and a short body fail the header's checks, named the same way.
        let (_, mut snapshot) = a_snapshot();
        let last = snapshot.len() - 1;
        snapshot[last] ^= 1;
        assert_eq!(
            check_received(&vote(), &meta, &snapshot).map_err(|e| e.field),
            Err("data")
        );
        assert_eq!(
            check_received(&vote(), &meta, &[0xff; 25]).map_err(|e| e.field),
            Err("data")
        );
    }

    #[test]
    fn a_meta_that_does_not_fit_its_body_or_its_vote_is_refused_by_field() {
        let (meta, snapshot) = a_snapshot();
        let field_of = |meta: &SnapshotMeta, vote: &Vote<NodeId>| {
            check_received(vote, meta, &snapshot).map_err(|e| e.field)
        };
        let further = SnapshotMeta {
            last_log_id: Some(log_id(2, 900)),
            ..meta.clone()
        };
        assert_eq!(field_of(&further, &vote()), Err("meta.last_log_id"));
        assert_eq!(
            field_of(&meta, &Vote::new_committed(1, 1)),
            Err("meta.last_log_id.term")
        );
        let later_membership = SnapshotMeta {
            last_membership: StoredMembership::new(
                Some(log_id(2, 8)),
                meta.last_membership.membership().clone(),
            ),
            ..meta.clone()
        };
        assert_eq!(
            field_of(&later_membership, &vote()),
            Err("meta.last_membership.log_id")
        );
        let no_voters = SnapshotMeta {
            last_membership: StoredMembership::new(Some(log_id(1, 1)), Membership::default()),
            ..meta.clone()
        };
        assert_eq!(field_of(&no_voters, &vote()), Err("meta.last_membership"));
        let other = SnapshotMeta {
            last_membership: StoredMembership::new(
                Some(log_id(1, 1)),
                Membership::new(vec![BTreeSet::from([1])], ()),
            ),
            ..meta.clone()
        };
        assert_eq!(field_of(&other, &vote()), Err("meta.last_membership"));
    }

    #[test]
    fn offsets_past_what_arrived_and_other_snapshots_are_refused() {
        let (_, snapshot) = a_snapshot();
        let mut intake = SnapshotIntake::default();
        let err = intake.admit("s1", 1 << 20, b"x", false).expect_err("a gap");
        assert_eq!(err.field, "meta.snapshot_id");
        assert_eq!(intake.admit("s1", 0, &snapshot[..10], false), Ok(None));
        let err = intake
            .admit("s1", 11, &snapshot[11..], true)
            .expect_err("a gap");
        assert_eq!(err.field, "offset");
        let err = intake
            .admit("s2", 10, &snapshot[10..], true)
            .expect_err("another id");
        assert_eq!(err.field, "meta.snapshot_id");
        let err = intake
            .admit("s1", u64::MAX, b"xy", false)
            .expect_err("overflow");
        assert_eq!(err.field, "offset");
        // A header claiming 4 GiB reserves nothing beyond what arrived.
        let mut claims_much = sealed_garbage(&[0; 8]);
        claims_much[8..16].copy_from_slice(&(SNAPSHOT_BYTES_MAX - 64).to_le_bytes());
        let mut intake = SnapshotIntake::default();
        assert_eq!(intake.admit("s3", 0, &claims_much, false), Ok(None));
        assert!(intake.data.capacity() <= 2 * claims_much.len());
    }
}
