//! What the nemesis saw: every call, with when it was invoked and when it returned (in
//! microseconds since the run began), on which node, what it asked and what came back.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use ankusa_fleet::lock::lock;

/// What a call asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// A claim-only hit (the checked key space: no charges, so only the claim decides).
    Claim { key: String, hook: String },
    /// A charge-only hit on a tenant's bucket.
    Charge { tenant: String },
    /// Settle a claim: commit (`true`) or release.
    Settle {
        key: String,
        hook: String,
        commit: bool,
    },
    /// Reset a tenant's buckets.
    Reset { tenant: String },
}

/// What came back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Allowed,
    Duplicate { holder: String },
    Pending,
    RateLimited,
    Settled,
    Recreated,
    Conflict { holder: String },
    Queued,
    Reset,
}

/// Who decided an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decided {
    Fleet,
    Local,
}

/// How a call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An answer, and who decided it.
    Answered(Answer, Decided),
    /// An error or no answer in time: it may or may not have taken effect.
    Unknown(String),
    /// No connection to the node could be made: the call surely never reached it.
    NotSent(String),
}

/// One call.
#[derive(Clone, Debug)]
pub struct Op {
    /// Its place in the history (ids are dense, from 0).
    pub id: usize,
    /// The client that made it.
    pub client: usize,
    /// The node it was sent to.
    pub node: u64,
    pub request: Request,
    /// The call's `timeout_ms`.
    pub timeout_ms: u64,
    pub invoke_us: u64,
    pub return_us: u64,
    pub outcome: Outcome,
}

/// The history being recorded, shared by every client.
#[derive(Clone)]
pub struct Recorder {
    started: Instant,
    ops: Arc<Mutex<Vec<Op>>>,
}

impl Recorder {
    /// A recorder whose clock starts now.
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            ops: Arc::default(),
        }
    }

    /// Microseconds since the run began.
    pub fn now_us(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Records one finished call.
    pub fn record(&self, op: Op) {
        lock(&self.ops).push(Op { id: 0, ..op });
    }

    /// The calls so far, ordered by invocation, with dense ids.
    pub fn history(&self) -> Vec<Op> {
        let mut ops = lock(&self.ops).clone();
        ops.sort_by_key(|op| (op.invoke_us, op.client));
        for (id, op) in ops.iter_mut().enumerate() {
            op.id = id;
        }
        ops
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}
