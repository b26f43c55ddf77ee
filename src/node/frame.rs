//! A `HitBatch` frame's fleet-scoped hits as one unit of work: one proposer unit, one
//! deadline and one answer channel for every hit of the frame that routes to the fleet
//! alone and shares a timeout, instead of one each. Each hit is still its own decision:
//! its own answer, and, when the fleet did not answer in time, its own fallback answer.

use std::time::Duration;

use super::{fleet_deadline, mismatched, Decided, Node, NodeError, HIT_RESERVE_MAX};
use crate::node::request::HitInput;
use crate::planted::PlantedBug;
use crate::raft::ProposeRefusal;
use crate::state::{Answer, EncodedCommand, HitAnswer};

/// One hit's result, as [`Node::hit`] gives it.
pub type HitResult = Result<Decided<HitAnswer>, NodeError>;

impl Node {
    /// Decides `inputs`, which all route to the fleet alone (`route::Route::FleetOnly`)
    /// and all have this `timeout`: their commands go to the proposer as one unit (one
    /// log entry, in this order), and the answers come back in the same order. When the
    /// fleet does not answer by the deadline, each hit is answered by the fallback on its
    /// own, exactly as [`Node::hit`] would.
    pub async fn hit_fleet_group(
        &self,
        mut inputs: Vec<HitInput>,
        timeout: Duration,
    ) -> Vec<HitResult> {
        if self.planted_bug.is(PlantedBug::OneChargeOver) {
            inputs.iter_mut().for_each(Self::plant_one_charge_over);
        }
        let deadline = fleet_deadline(timeout, HIT_RESERVE_MAX);
        let commands = inputs
            .iter()
            .map(|input| EncodedCommand::hit(&input.charges, input.claim.as_ref(), self.id))
            .collect::<Result<Vec<_>, _>>();
        let proposed = match commands {
            Ok(commands) => self.proposer.propose_many(commands, deadline).await,
            Err(e) => Err(ProposeRefusal::Fatal {
                reason: format!("command: {e}"),
            }),
        };
        match proposed {
            Ok(answers) => inputs
                .iter()
                .zip(answers)
                .map(|(input, answer)| match answer {
                    Answer::Hit(answer) => {
                        Ok(self.with_planted_bug(Decided::fleet(answer), input.claim.as_ref()))
                    }
                    Answer::Refused(refusal) => Err(NodeError::Refused { refusal }),
                    other => Err(mismatched(&other)),
                })
                .collect(),
            Err(refusal) => inputs
                .iter()
                .map(|input| {
                    let error = NodeError::from(refusal.clone());
                    if !error.fleet_unavailable() {
                        return Err(error);
                    }
                    let decided =
                        self.fallback_hit(&input.charges, input.claim.as_ref(), &error)?;
                    Ok(self.with_planted_bug(decided, input.claim.as_ref()))
                })
                .collect(),
        }
    }
}
