//! A backup of the fleet's state for `snapshot save` (the Admin service's `SaveSnapshot`):
//! the bytes of a snapshot that covers everything the fleet answered before the call.

use std::time::Duration;

use openraft::error::{CheckIsLeaderError, RaftError};

use super::{FleetUnavailable, Node, NodeError};
use crate::raft::{LogId, MemberNode, NodeId};

/// How long a backup may wait for the fleet: the read's quorum round and a snapshot build.
const BACKUP_WAIT: Duration = Duration::from_secs(60);
/// How long one wait for a build lasts before the build is asked for again (openraft takes
/// no second request while one build runs, and that one may stop short of the read).
const BUILD_WAIT: Duration = Duration::from_secs(2);

impl Node {
    /// On the leader: confirms the leadership with a quorum and waits until the commit
    /// index it read is applied (openraft's linearizable read), then returns the stored
    /// snapshot once one covers that index, asking for a build if none does yet. Whatever
    /// the fleet answered before the call is in it; what this node decided alone and has
    /// not reconciled yet is not (it is not the fleet's).
    ///
    /// # Errors
    /// `NotLeader` on a follower (the caller forwards), `Unavailable` when no quorum
    /// confirms the leader or no snapshot covers the read within a minute, `Failed`
    /// when openraft cannot trigger the snapshot or the stored one cannot be read.
    pub async fn backup(&self) -> Result<(LogId, Vec<u8>), NodeError> {
        let started = tokio::time::Instant::now();
        let read = tokio::time::timeout(BACKUP_WAIT, self.raft.ensure_linearizable())
            .await
            .map_err(|_| NodeError::Unavailable {
                why: FleetUnavailable::NoQuorum,
            })?
            .map_err(read_error)?;
        loop {
            // The stored bytes are read only once openraft reports a snapshot that covers
            // the read, not on every wait.
            let reported = self.raft.metrics().borrow().snapshot >= read;
            if reported {
                if let Some(found) = self.covering_snapshot(read).await? {
                    return Ok(found);
                }
            }
            if started.elapsed() >= BACKUP_WAIT {
                return Err(NodeError::Unavailable {
                    why: FleetUnavailable::NoSnapshot { index: index(read) },
                });
            }
            self.raft.trigger().snapshot().await.map_err(fatal)?;
            // A timeout only means the build is not done yet: the loop asks again.
            let _ = self
                .raft
                .wait(Some(BUILD_WAIT))
                .metrics(|m| m.snapshot >= read, "a snapshot covering the backup")
                .await;
        }
    }

    /// The stored snapshot, if it covers `read`.
    async fn covering_snapshot(
        &self,
        read: Option<LogId>,
    ) -> Result<Option<(LogId, Vec<u8>)>, NodeError> {
        let stored = self
            .state
            .snapshots()
            .current_between_writes()
            .await
            .map_err(fatal)?;
        Ok(stored.and_then(|stored| match stored.meta.last_log_id {
            Some(last) if Some(last) >= read => Some((last, stored.data)),
            _ => None,
        }))
    }
}

fn index(read: Option<LogId>) -> u64 {
    read.map_or(0, |log_id| log_id.index)
}

fn fatal(e: impl std::error::Error + Send + Sync + 'static) -> NodeError {
    NodeError::Failed(Box::new(e))
}

fn read_error(e: RaftError<NodeId, CheckIsLeaderError<NodeId, MemberNode>>) -> NodeError {
    match e {
        RaftError::APIError(CheckIsLeaderError::ForwardToLeader(forward)) => NodeError::NotLeader {
            leader_raft_addr: forward.leader_node.map(|n| n.raft_addr),
        },
        other => NodeError::Unavailable {
            why: FleetUnavailable::Read(Box::new(other)),
        },
    }
}
