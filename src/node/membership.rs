//! Membership operations on the leader (the Admin service's `AddMember` and
//! `RemoveMember`): one change at a time, each on top of a membership entry that is on this
//! node's disk.

use std::collections::BTreeSet;

use openraft::error::{ClientWriteError, RaftError};
use openraft::ChangeMembers;

use super::{Node, NodeError};
use crate::raft::{MemberNode, NodeId};

impl Node {
    fn ensure_leader(&self) -> Result<(), NodeError> {
        let status = self.status();
        if status.leader_id == Some(self.id) {
            return Ok(());
        }
        let leader_raft_addr = status
            .leader_id
            .and_then(|leader| status.members.iter().find(|(id, _, _)| *id == leader))
            .map(|(_, node, _)| node.raft_addr.clone());
        Err(NodeError::NotLeader { leader_raft_addr })
    }

    /// Waits until the current membership entry is on this node's disk. openraft lets the
    /// next change through once the current one is committed, and on the leader it counts
    /// its own copy before that copy is durable (docs/storage.md, "The leader's early flush
    /// report"): a second change on top of a first held by one disk could, after a power
    /// cut, leave two configurations that each elect a leader.
    async fn membership_durable(&self) -> Result<(), NodeError> {
        let index = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .log_id()
            .map(|log_id| log_id.index);
        match index {
            Some(index) => self
                .durable
                .wait_for(index)
                .await
                .map_err(|e| NodeError::Failed(Box::new(e))),
            None => Ok(()),
        }
    }

    /// Adds a member: it joins as a learner, catches up (by snapshot where the log was
    /// purged), and is promoted to voter when asked and fewer than `voters_max` vote.
    ///
    /// # Errors
    /// `NotLeader` on a follower (the caller forwards), `MembershipRejected` when openraft
    /// refuses.
    pub async fn add_member(
        &self,
        id: NodeId,
        member: MemberNode,
        voter: bool,
    ) -> Result<String, NodeError> {
        self.ensure_leader()?;
        let _alone = self.membership_changes.lock().await;
        self.membership_durable().await?;
        self.raft
            .add_learner(id, member, true)
            .await
            .map_err(membership_error)?;
        tracing::info!(node_id = id, "member added as learner");
        let voters = self.status().members.iter().filter(|(_, _, v)| *v).count();
        if !voter {
            return Ok(format!("node {id} added as a learner"));
        }
        if voters >= self.voters_max {
            return Ok(format!(
                "node {id} added as a learner: {voters} voters already (voters_max {})",
                self.voters_max
            ));
        }
        let promote = ChangeMembers::AddVoterIds(BTreeSet::from([id]));
        self.membership_durable().await?;
        self.raft
            .change_membership(promote, false)
            .await
            .map_err(membership_error)?;
        tracing::info!(node_id = id, "member promoted to voter");
        Ok(format!("node {id} added as a voter"))
    }

    /// Removes a member (voter or learner) from the fleet; it stops taking part.
    ///
    /// # Errors
    /// `NotLeader` on a follower, `Membership` for an id that is not a member,
    /// `MembershipRejected` when openraft refuses.
    pub async fn remove_member(&self, id: NodeId) -> Result<String, NodeError> {
        self.ensure_leader()?;
        let _alone = self.membership_changes.lock().await;
        self.membership_durable().await?;
        let Some((_, _, voter)) = self
            .status()
            .members
            .into_iter()
            .find(|(member, _, _)| *member == id)
        else {
            return Err(NodeError::Membership {
                reason: format!("node {id} is not a member"),
            });
        };
        let ids = BTreeSet::from([id]);
        let change = if voter {
            ChangeMembers::RemoveVoters(ids)
        } else {
            ChangeMembers::RemoveNodes(ids)
        };
        self.raft
            .change_membership(change, false)
            .await
            .map_err(membership_error)?;
        tracing::info!(node_id = id, "member removed");
        Ok(format!("node {id} removed"))
    }
}

fn membership_error(e: RaftError<NodeId, ClientWriteError<NodeId, MemberNode>>) -> NodeError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => NodeError::NotLeader {
            leader_raft_addr: forward.leader_node.map(|n| n.raft_addr),
        },
        other => NodeError::MembershipRejected(Box::new(other)),
    }
}
