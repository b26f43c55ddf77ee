//! Group commit on the write path: callers' commands queue here, one batcher task drains
//! the queue into batches, and each batch becomes ONE log entry (on the leader) or ONE
//! `Propose` call (on a follower, relayed to the leader). Each caller gets its own answer
//! back out of the batch.
//!
//! Adaptive by construction: a batch leaves as soon as an in-flight slot is free, so a lone
//! caller goes at once and a busy node fills batches while the slots are taken. Bounded:
//! `batch_commands_max`, `queue_depth_max`, `proposals_in_flight_max` (entries a leader
//! proposes at once) and `forwards_in_flight_max` (batches a follower forwards at once) are
//! named limits, and a full queue is an answer (overloaded), not an unbounded wait.
//!
//! A busy batch also *lingers* (`batch_linger_us`, `linger_target`): callers that each
//! wait for their answer before sending again split into two groups that take turns,
//! because the callers one batch answers come back while the next batch, holding the other
//! group, is already on its way. Waiting a moment for them merges the groups, so entries
//! and forwards carry more commands for less CPU per hit (docs/decisions/006). Followers
//! wait for a bigger share of their last forward than the leader of its last entry
//! (`FOLLOWER_LINGER_SHARE`). A lone caller never lingers, and only local callers' lone
//! commands are lingered for by count (`Queued::lingers`): an edge's `HitBatch` frame or
//! a follower's forward is gathered by its sender, which sends the next one only once this
//! one is answered.
//!
//! A leader with one entry in flight also waits for the *senders* of its last entry
//! (`origins`, docs/decisions/028): each frame or forward of two or more commands that
//! the last entry answered is about to be followed by its sender's next, so the next entry
//! waits (within the same `batch_linger_us`) until a unit from each of them is in, unless
//! that sender took longer than the linger to come back last time. Without that wait the
//! frames and forwards split into two groups that ride alternate entries, as lone callers
//! do without the linger: a follower's forward comes back two hops after the leader's own
//! frame, just after the entry holding that frame has left.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use super::order::SubmitOrder;
use super::router::Router;
use crate::lock::lock;
use crate::raft::{NodeId, ProposeRefusal, ProposeRequest, ProposeResponse};
use crate::state::check::{self, Ceilings};
use crate::state::{Answer, EncodedCommand, Refusal};
use origins::Origins;

/// The retry hint given with an overloaded answer.
const OVERLOADED_RETRY_AFTER_MS: u64 = 10;
/// A batch lingers only after one with at least this many commands.
const LINGER_FROM_COMMANDS: usize = 2;

/// Where a unit of the queue comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    /// A local caller's lone command (a unary `Hit`, a settle): what a busy batch lingers
    /// for by count, since its caller sends again as soon as the batch before is answered.
    Lone,
    /// An edge's `HitBatch` frame on this node.
    Frame,
    /// A follower's forward, by the verified peer, else the node the first valid command
    /// names (`check_forwarded`; `None`: neither).
    Forward(Option<NodeId>),
}

/// One caller waiting in the queue: a local caller with one command, or a frame or a
/// follower's forwarded batch with many (it stays one unit: one reply, no per-command
/// channel).
pub(super) struct Queued {
    /// Moved out into the batch's shared slice when the batch is sent: the bytes the
    /// caller encoded (or the follower sent), never encoded again.
    pub(super) commands: Vec<EncodedCommand>,
    /// How many commands the unit brought (its share of the batch's answers).
    count: usize,
    /// Who sent the unit.
    origin: Origin,
    /// When it entered the queue: how soon its sender came back (`origins`).
    arrived: Instant,
    pub(super) deadline: Instant,
    reply: oneshot::Sender<ProposeResponse>,
}

impl Queued {
    /// Whether a busy batch lingers for more commands like this unit's: a local lone
    /// command, whose caller sends again as soon as the batch before is answered. Frames
    /// and forwards are not counted towards a linger's target: their senders gather
    /// commands themselves and send the next unit only once this one is answered (a
    /// frame's client, a follower's batcher behind its forward slots), so a batch waiting
    /// for their commands would stall until the linger ran out. A leader waits for their
    /// senders instead ([`Queued::returns`]).
    fn lingers(&self) -> bool {
        self.origin == Origin::Lone
    }

    /// Whether this unit's sender sends its next one as soon as this one is answered:
    /// a frame or a forward of two or more commands, gathered while one was in flight.
    fn returns(&self) -> bool {
        self.count >= LINGER_FROM_COMMANDS
            && matches!(self.origin, Origin::Frame | Origin::Forward(Some(_)))
    }
}

/// The limits of the queue and the batches.
#[derive(Clone, Copy, Debug)]
pub struct BatchLimits {
    pub batch_commands_max: usize,
    pub queue_depth_max: usize,
    /// Log entries this node proposes at once while it leads.
    pub proposals_in_flight_max: usize,
    /// Batches this node forwards to the leader at once while it follows.
    pub forwards_in_flight_max: usize,
    /// The longest a busy batch waits for more commands (`linger_target`) and a leader's
    /// entry for its senders (`origins`); zero: never. The runtime's timer ticks in
    /// milliseconds, so a wait that runs out takes up to a millisecond longer.
    pub linger: Duration,
}

/// The share of the previous batch a busy batch waits for, as (numerator, denominator), on
/// the leader and on a follower. A follower waits for more: its forward is one unit at the
/// leader, so a caller it leaves out arrives after the leader's entry has left and waits a
/// whole entry more (the shares were measured: docs/decisions/006).
const LEADER_LINGER_SHARE: (usize, usize) = (7, 8);
const FOLLOWER_LINGER_SHARE: (usize, usize) = (15, 16);

/// How many commands a batch waits for before it leaves: those queued now, plus most of the
/// previous batch's (its callers, answered, are on their way back). Zero, leave at once,
/// when lingering is off or the previous batch was a lone command.
fn linger_target(previous: usize, queued: usize, leading: bool, limits: &BatchLimits) -> usize {
    if limits.linger.is_zero() || previous < LINGER_FROM_COMMANDS {
        return 0;
    }
    let (share, of) = if leading {
        LEADER_LINGER_SHARE
    } else {
        FOLLOWER_LINGER_SHARE
    };
    (queued + previous * share / of).min(limits.batch_commands_max)
}

/// The handle callers use; cheap to clone.
#[derive(Clone)]
pub struct Proposer {
    queue: mpsc::Sender<Queued>,
    /// What a forwarded command is re-checked against (`ttl_ms_max`, `capacity_us_max`).
    ceilings: Ceilings,
}

impl Proposer {
    /// Starts the batcher task for `router` and returns the queue's handle.
    pub fn start(router: Arc<Router>, limits: BatchLimits, ceilings: Ceilings) -> Self {
        let (queue, receiver) = mpsc::channel(limits.queue_depth_max);
        tokio::spawn(run_batcher(receiver, router, limits));
        Self { queue, ceilings }
    }

    /// A follower's forwarded batch (`Propose`), each command re-checked first: contract
    /// §9 and this node's ceilings, as `api::validate` checks an edge call. A command that
    /// fails is answered [`Refusal::Invalid`] at its position, naming its index and field,
    /// and never proposed; the others of the batch go on. (A forwarded command is proposed
    /// by whichever node leads when it reaches the queue, and every entry is stamped with
    /// that node's state limits, so the limits need no check here.)
    ///
    /// With a verified `sender` (the node identity of the caller's certificate), a command
    /// that names another node (`check::sent_by`) is refused the same way.
    ///
    /// The commands enter the queue before this returns, so the `Propose` frames of one
    /// stream, handed over in the order they came, keep that order (`node::order`).
    pub fn propose_forwarded(
        &self,
        request: ProposeRequest,
        sender: Option<NodeId>,
    ) -> impl std::future::Future<Output = ProposeResponse> + Send + 'static {
        let (valid, refused, named) = check_forwarded(request.commands, sender, &self.ceilings);
        let committed = (!valid.is_empty()).then(|| {
            let deadline = Instant::now() + Duration::from_millis(request.timeout_ms);
            self.submit(valid, deadline, Origin::Forward(sender.or(named)))
        });
        async move {
            let committed = match committed {
                Some(answers) => answers.await?,
                None => Vec::new(),
            };
            let mut committed = committed.into_iter();
            refused
                .into_iter()
                .map(|answer| {
                    answer
                        .or_else(|| committed.next())
                        .ok_or_else(|| ProposeRefusal::Fatal {
                            reason: "the fleet returned fewer answers than commands".to_owned(),
                        })
                })
                .collect()
        }
    }

    /// Commits one command through the fleet and returns its answer.
    ///
    /// # Errors
    /// `Overloaded` when the queue is full, `Unavailable` when the deadline passed first (the
    /// command may still commit later), `NotLeader` never (routing is done here).
    pub async fn propose(
        &self,
        command: EncodedCommand,
        deadline: Instant,
    ) -> Result<Answer, ProposeRefusal> {
        let mut answers = self.submit(vec![command], deadline, Origin::Lone).await?;
        answers.pop().ok_or_else(|| ProposeRefusal::Fatal {
            reason: "the fleet returned no answer".to_owned(),
        })
    }

    /// Commits `commands` as one unit of the queue (one log entry, in this order) and
    /// returns their answers in the same order: an edge's `HitBatch` frame.
    ///
    /// # Errors
    /// As [`Proposer::propose`], for the unit as a whole.
    pub async fn propose_many(
        &self,
        commands: Vec<EncodedCommand>,
        deadline: Instant,
    ) -> ProposeResponse {
        self.submit(commands, deadline, Origin::Frame).await
    }

    /// Enters `commands` into the queue as one unit now (or finds it full), and returns
    /// the wait for their answers: a batch of forwarded commands, so batches from several
    /// followers and the leader's own callers share log entries.
    fn submit(
        &self,
        commands: Vec<EncodedCommand>,
        deadline: Instant,
        origin: Origin,
    ) -> impl std::future::Future<Output = ProposeResponse> + Send + 'static {
        let (reply, answers) = oneshot::channel();
        let queued = Queued {
            count: commands.len(),
            origin,
            arrived: Instant::now(),
            commands,
            deadline,
            reply,
        };
        let entered = self.queue.try_send(queued).is_ok();
        if !entered {
            metrics::counter!("ankusa_proposals_overloaded_total").increment(1);
        }
        async move {
            if !entered {
                return Err(ProposeRefusal::Overloaded {
                    retry_after_ms: OVERLOADED_RETRY_AFTER_MS,
                });
            }
            match tokio::time::timeout_at(deadline, answers).await {
                Ok(Ok(result)) => result,
                Ok(Err(_dropped)) => Err(ProposeRefusal::Fatal {
                    reason: "the batcher stopped".to_owned(),
                }),
                Err(_elapsed) => {
                    woke_at_deadline(deadline);
                    Err(ProposeRefusal::Unavailable {
                        reason: "deadline".to_owned(),
                    })
                }
            }
        }
    }
}

/// A deadline's timer fires within the runtime's millisecond tick; a caller woken later
/// than this was held up by its node (blocking work on the runtime thread, or a host that
/// gave the thread no CPU), and its answer leaves that much later, past its timeout if the
/// delay outgrows the local reserve (contract §7).
const WAKEUP_LATE_WARN: Duration = Duration::from_millis(2);
/// At most one warning per this long: a held-up runtime wakes every waiting caller late.
const WAKEUP_LATE_WARN_EVERY: Duration = Duration::from_secs(1);

/// Records how late a caller whose fleet deadline passed was woken
/// (`ankusa_deadline_wakeup_late_seconds`), and warns when it was late past
/// [`WAKEUP_LATE_WARN`], so a late answer can be told from a slow fleet in the node's log.
fn woke_at_deadline(deadline: Instant) {
    static LAST_WARNED: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    let now = Instant::now();
    let late = now.saturating_duration_since(deadline);
    metrics::histogram!("ankusa_deadline_wakeup_late_seconds").record(late.as_secs_f64());
    if late <= WAKEUP_LATE_WARN {
        return;
    }
    // Never waits: another caller holding it is warning for this moment already.
    let Some(mut last) = crate::lock::try_lock(&LAST_WARNED) else {
        return;
    };
    if last.is_some_and(|at| now.saturating_duration_since(at) < WAKEUP_LATE_WARN_EVERY) {
        return;
    }
    *last = Some(now);
    drop(last);
    tracing::warn!(
        late_ms = u64::try_from(late.as_millis()).unwrap_or(u64::MAX),
        "a caller was woken late at its deadline: this node's runtime thread was held up"
    );
}

/// Splits a forwarded batch into the commands to propose (the very bytes the follower
/// sent, in order) and, by position, the refusal of each one that is not: its bytes do not
/// decode to one command, it names another node than the verified `sender`
/// (`check::sent_by`), or it fails `check::command`. A command is decoded here only to be
/// checked; what is proposed is what was received. Also gives the node the first valid
/// command that names one speaks for (`check::named_node`): without a verified sender,
/// who the batch comes from as far as the leader's wait is concerned.
fn check_forwarded(
    commands: Vec<EncodedCommand>,
    sender: Option<NodeId>,
    ceilings: &Ceilings,
) -> (Vec<EncodedCommand>, Vec<Option<Answer>>, Option<NodeId>) {
    let mut refused: Vec<Option<Answer>> = Vec::with_capacity(commands.len());
    let mut valid = Vec::with_capacity(commands.len());
    let mut named = None;
    for (i, encoded) in commands.into_iter().enumerate() {
        let checked = match encoded.decode() {
            Ok(command) => sender
                .map_or(Ok(()), |sender| check::sent_by(&command, sender))
                .and_then(|()| check::command(&command, ceilings))
                .inspect(|()| named = named.or_else(|| check::named_node(&command))),
            Err(e) => Err(check::InvalidField {
                field: String::new(),
                reason: format!("does not decode to one command: {e}"),
            }),
        };
        match checked {
            Ok(()) => {
                valid.push(encoded);
                refused.push(None);
            }
            Err(invalid) => {
                metrics::counter!("ankusa_forwarded_commands_refused_total").increment(1);
                tracing::warn!(index = i, field = %invalid.field, reason = %invalid.reason, "refused a forwarded command");
                let field = if invalid.field.is_empty() {
                    format!("commands[{i}]")
                } else {
                    format!("commands[{i}].{}", invalid.field)
                };
                refused.push(Some(Answer::Refused(Refusal::Invalid {
                    field,
                    reason: invalid.reason,
                })));
            }
        }
    }
    (valid, refused, named)
}

async fn run_batcher(
    mut receiver: mpsc::Receiver<Queued>,
    router: Arc<Router>,
    limits: BatchLimits,
) {
    let write_slots = Arc::new(Semaphore::new(limits.proposals_in_flight_max));
    let forward_slots = Arc::new(Semaphore::new(limits.forwards_in_flight_max));
    // A unit that did not fit the last batch starts the next one.
    let mut carried: Option<Queued> = None;
    // Lingering commands (`Queued::lingers`) in the last batch (an entry while leading, a
    // forward while following).
    let mut previous = 0;
    // The senders of frames and forwards a leader's entries answered (decision 028), kept
    // while this node leads and waits for them, and when the last entry was answered (its
    // task sets it before it frees the slot).
    let mut origins = Origins::default();
    let answered_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    // With one entry in flight the last one is answered before the next is made, so its
    // senders are on their way back; with more they may still be waiting for it.
    let waits_for_senders = limits.proposals_in_flight_max == 1 && !limits.linger.is_zero();
    let mut waited_for_senders = false;
    // Batches are submitted in the order they are made here (`node::order`).
    let mut turns = SubmitOrder::default();
    loop {
        let first = match carried.take() {
            Some(queued) => queued,
            None => match receiver.recv().await {
                Some(queued) => queued,
                None => return,
            },
        };
        // Commands queue up while the batch waits for a slot: that wait is the batching.
        let leading = router.is_leader();
        let slots = if leading {
            &write_slots
        } else {
            &forward_slots
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let waits = leading && waits_for_senders;
        if waits != waited_for_senders {
            // A change of role: what was known is of batches this node made in the other.
            origins = Origins::default();
            waited_for_senders = waits;
        }
        let awaited = if waits {
            if let Some(at) = lock(&answered_at).take() {
                origins.answered(at);
            }
            origins.awaited()
        } else {
            Vec::new()
        };
        let mut batch = Batch::new(first, limits.batch_commands_max);
        while let Ok(queued) = receiver.try_recv() {
            if let Err(queued) = batch.admit(queued) {
                carried = Some(queued);
                break;
            }
        }
        let wait = Wait {
            lingering: linger_target(previous, batch.lingering, leading, &limits),
            origins: &awaited,
        };
        if carried.is_none() && !batch.holds(&wait) {
            carried = linger(&mut receiver, &mut batch, &wait, limits.linger).await;
        }
        metrics::histogram!("ankusa_batch_commands").record(batch.commands as f64);
        previous = batch.lingering;
        let answered = waits.then(|| {
            origins.made(&batch.units, limits.linger);
            Arc::clone(&answered_at)
        });
        let batch = batch.units;
        let router = router.clone();
        let turn = turns.take();
        tokio::spawn(async move {
            router.commit_batch(batch, turn).await;
            if let Some(answered) = answered {
                *lock(&answered) = Some(Instant::now());
            }
            drop(slot);
        });
    }
}

/// What a busy batch waits for before it leaves.
struct Wait<'a> {
    /// This many lingering commands (`linger_target`).
    lingering: usize,
    /// A unit from each of these origins (`Origins::awaited`).
    origins: &'a [Origin],
}

/// Waits at most `linger` for `batch` to hold what `wait` asks; returns the unit that did
/// not fit, if one came (it starts the next batch).
async fn linger(
    receiver: &mut mpsc::Receiver<Queued>,
    batch: &mut Batch,
    wait: &Wait<'_>,
    linger: Duration,
) -> Option<Queued> {
    let lingered_from = Instant::now();
    // One timer for the whole wait, not one per arrival.
    let expiry = tokio::time::sleep_until(lingered_from + linger);
    tokio::pin!(expiry);
    let mut carried = None;
    let mut outcome = "filled";
    while carried.is_none() && !batch.holds(wait) {
        let queued = tokio::select! {
            queued = receiver.recv() => queued,
            () = &mut expiry => {
                outcome = "expired";
                None
            }
        };
        let Some(queued) = queued else {
            break;
        };
        carried = batch.admit(queued).err();
    }
    metrics::counter!("ankusa_batch_lingers_total", "outcome" => outcome).increment(1);
    metrics::histogram!("ankusa_batch_linger_seconds")
        .record(lingered_from.elapsed().as_secs_f64());
    carried
}

/// A batch being filled: its units and their commands, never more than `commands_max`.
struct Batch {
    units: Vec<Queued>,
    commands: usize,
    /// The commands of lingering units (`Queued::lingers`): what `linger_target` counts.
    lingering: usize,
    commands_max: usize,
}

impl Batch {
    fn new(first: Queued, commands_max: usize) -> Self {
        Self {
            commands: first.count,
            lingering: if first.lingers() { first.count } else { 0 },
            units: vec![first],
            commands_max,
        }
    }

    /// Adds `queued`, or gives it back when it would not fit.
    fn admit(&mut self, queued: Queued) -> Result<(), Queued> {
        if self.commands + queued.count > self.commands_max {
            return Err(queued);
        }
        self.commands += queued.count;
        if queued.lingers() {
            self.lingering += queued.count;
        }
        self.units.push(queued);
        Ok(())
    }

    /// Whether the batch holds what `wait` asks for.
    fn holds(&self, wait: &Wait<'_>) -> bool {
        self.lingering >= wait.lingering
            && wait
                .origins
                .iter()
                .all(|origin| self.units.iter().any(|unit| unit.origin == *origin))
    }
}

/// Hands each caller its own answers out of the batch's, in order.
pub(super) fn reply_all(batch: Vec<Queued>, outcome: ProposeResponse) {
    let mut answers = match outcome {
        Ok(answers) => answers.into_iter(),
        Err(refusal) => {
            for queued in batch {
                let _ = queued.reply.send(Err(refusal.clone()));
            }
            return;
        }
    };
    for queued in batch {
        let own: Vec<Answer> = answers.by_ref().take(queued.count).collect();
        let reply = if own.len() == queued.count {
            Ok(own)
        } else {
            Err(ProposeRefusal::Fatal {
                reason: "the fleet returned fewer answers than commands".to_owned(),
            })
        };
        let _ = queued.reply.send(reply);
    }
}

/// Drops the units whose callers gave up, with their commands. The rare case copies the
/// commands that stay; the usual one hands `commands` back as it is.
pub(super) fn without_given_up(
    batch: &mut Vec<Queued>,
    commands: Arc<[EncodedCommand]>,
) -> Arc<[EncodedCommand]> {
    // The usual case, on every entry: nobody gave up, nothing to allocate.
    if !batch.iter().any(|queued| queued.reply.is_closed()) {
        return commands;
    }
    // Read once: a caller can give up at any moment, and the commands kept must be exactly
    // those of the units kept.
    let gave_up: Vec<bool> = batch
        .iter()
        .map(|queued| queued.reply.is_closed())
        .collect();
    let mut kept_commands = Vec::new();
    let mut kept_units = Vec::with_capacity(batch.len());
    let mut start = 0;
    for (queued, gave_up) in batch.drain(..).zip(gave_up) {
        let end = start + queued.count;
        if !gave_up {
            kept_commands.extend_from_slice(&commands[start..end]);
            kept_units.push(queued);
        }
        start = end;
    }
    *batch = kept_units;
    kept_commands.into()
}

impl crate::raft::service::ProposalSink for Proposer {
    fn propose(
        &self,
        request: ProposeRequest,
        sender: Option<NodeId>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ProposeResponse> + Send + 'static>>
    {
        Box::pin(self.propose_forwarded(request, sender))
    }
}

mod origins;
#[cfg(test)]
mod tests;
