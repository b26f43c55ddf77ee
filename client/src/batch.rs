//! The hit path: one task per [`Client`](crate::Client) owns the `HitBatch` stream, gathers
//! the hits of every clone into frames, and hands each answer to its caller by id.
//!
//! With no frame in flight a hit leaves at once, alone. While a frame is in flight, further
//! hits gather into the next one, which leaves when the frame in flight is answered (every
//! hit of it answered or past its deadline), when it is full ([`FRAME_HITS_MAX`] hits or
//! [`FRAME_BYTES_MAX`] bytes), or when its oldest hit has waited a quarter of its time.
//! When a reply answers the last hit in flight, the callers it answered get one turn of
//! the runtime before the next frame leaves, so a caller that hits again at once rides in
//! it rather than in the one after.
//! Answers come by id in any order, so a slow hit holds back no other caller.
//!
//! This task never waits for a caller, and a caller never waits for it past its deadline:
//! every hit it holds is answered at its deadline at the latest (`Timeout`), and a broken
//! stream fails every hit it holds at once (`Unavailable`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::Streaming;

use crate::pb::fleet_client::FleetClient;
use crate::{node_timeout_ms, pb, Error};

/// The most hits in one frame: the node's `HIT_BATCH_HITS_MAX` (one more refuses the whole
/// frame).
pub(crate) const FRAME_HITS_MAX: usize = 1024;

/// The most bytes of hits in one frame: the node decodes a frame of at most 1 MiB
/// (`HIT_BATCH_MESSAGE_BYTES_MAX`) and ends the stream on a larger one; 64 KiB of it are
/// left as margin.
const FRAME_BYTES_MAX: usize = 1024 * 1024 - 64 * 1024;

/// The largest hit the node takes (`API_MESSAGE_BYTES_MAX`): a larger one is refused here,
/// as a unary `Hit` would be, rather than sent.
const HIT_BYTES_MAX: usize = 16 * 1024;

/// What a hit's frame holds besides the hit itself, at most: its id (11 bytes), the
/// `timeout_ms` set as it leaves (6), and the tags and lengths of both envelopes (8).
const HIT_ENVELOPE_BYTES_MAX: usize = 32;

/// Hits gathered or in flight, at most: the task takes no further hit meanwhile, and
/// callers wait for room within their deadlines. The node works on 4096 hits of a stream
/// at once (`HIT_BATCH_HITS_IN_FLIGHT_MAX`); more here would only wait in buffers.
const HITS_HELD_MAX: usize = 4096;

/// A gathered hit waits for the frame in flight at most this share of its time: a node
/// slow on that frame (a fleet without quorum answers at its timeouts) must not take the
/// time the node needs to answer this one.
const GATHER_SHARE_OF_DEADLINE: u32 = 4;

/// One hit on its way to the task, and the caller's end of its answer.
pub(crate) struct Job {
    request: pb::HitRequest,
    /// When its caller stops waiting: `timeout_ms` is set from it as the hit leaves, so
    /// time spent gathered is not the node's to spend.
    pub(crate) deadline: Instant,
    /// The call's whole deadline, for its `Timeout`.
    budget: Duration,
    /// The hit's size in a frame, at most.
    bytes: usize,
    reply: oneshot::Sender<Result<pb::HitResponse, Error>>,
}

/// Where a caller waits for its hit's answer.
pub(crate) type Answer = oneshot::Receiver<Result<pb::HitResponse, Error>>;

impl Job {
    /// A hit to hand to the task, answered by `deadline`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a hit larger than the node takes: sent in a frame, it
    /// would end the stream for every hit on it.
    pub(crate) fn new(
        request: pb::HitRequest,
        deadline: Instant,
        budget: Duration,
    ) -> Result<(Job, Answer), Error> {
        let hit_bytes = request.encoded_len();
        if hit_bytes > HIT_BYTES_MAX {
            return Err(Error::InvalidArgument(format!(
                "hit: {hit_bytes} bytes, at most {HIT_BYTES_MAX}"
            )));
        }
        let (reply, answer) = oneshot::channel();
        let job = Job {
            request,
            deadline,
            budget,
            bytes: hit_bytes + HIT_ENVELOPE_BYTES_MAX,
            reply,
        };
        Ok((job, answer))
    }

    /// Answers the caller (who may be gone: then nobody needs it).
    pub(crate) fn answer(self, result: Result<pb::HitResponse, Error>) {
        let _ = self.reply.send(result);
    }

    /// Answers `Timeout`: the deadline has passed.
    pub(crate) fn time_out(self) {
        let budget = self.budget;
        self.answer(Err(Error::Timeout(budget)));
    }

    /// Whether the caller still waits for this hit at `now`; a hit whose deadline passed
    /// is answered `Timeout` here.
    fn still_wanted(self, now: Instant) -> Option<Job> {
        if self.reply.is_closed() {
            return None;
        }
        if self.deadline <= now {
            self.time_out();
            return None;
        }
        Some(self)
    }
}

/// Hits handed over together: one hit, or up to a frame of a `hit_many`.
pub(crate) type Submission = Vec<Job>;

/// Hits taken from callers and not sent yet, oldest first.
#[derive(Default)]
struct Gathered {
    jobs: VecDeque<Job>,
    bytes: usize,
    /// When the oldest-waiting of them has had its share of waiting
    /// ([`GATHER_SHARE_OF_DEADLINE`]).
    flush_at: Option<Instant>,
}

impl Gathered {
    fn push(&mut self, job: Job, now: Instant) {
        let share = job.deadline.saturating_duration_since(now) / GATHER_SHARE_OF_DEADLINE;
        let flush_at = now + share;
        self.flush_at = Some(self.flush_at.map_or(flush_at, |at| at.min(flush_at)));
        self.bytes += job.bytes;
        self.jobs.push_back(job);
    }

    fn len(&self) -> usize {
        self.jobs.len()
    }

    fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Whether a whole frame is gathered.
    fn has_full_frame(&self) -> bool {
        self.jobs.len() >= FRAME_HITS_MAX || self.bytes >= FRAME_BYTES_MAX
    }

    fn flush_due(&self, now: Instant) -> bool {
        self.flush_at.is_some_and(|at| at <= now)
    }

    /// The oldest hits that fit in one frame and are still wanted at `now` (possibly none,
    /// when every one taken was given up).
    fn take_frame(&mut self, now: Instant) -> Vec<Job> {
        let mut frame = Vec::new();
        let mut frame_bytes = 0;
        while let Some(job) = self.jobs.front() {
            let fits = frame.is_empty() || frame_bytes + job.bytes <= FRAME_BYTES_MAX;
            if frame.len() == FRAME_HITS_MAX || !fits {
                break;
            }
            let Some(job) = self.jobs.pop_front() else {
                break;
            };
            self.bytes -= job.bytes;
            if let Some(job) = job.still_wanted(now) {
                frame_bytes += job.bytes;
                frame.push(job);
            }
        }
        if self.jobs.is_empty() {
            self.flush_at = None;
        }
        frame
    }

    fn fail_all(&mut self, error: &Error) {
        for job in self.jobs.drain(..) {
            job.answer(Err(error.clone()));
        }
        self.bytes = 0;
        self.flush_at = None;
    }
}

/// Carries hits over one `HitBatch` stream at a time: opens it for the first hit, and
/// after it breaks, opens the next for the next hit. Ends when every [`Client`] clone is
/// gone and every hit it holds is answered.
///
/// [`Client`]: crate::Client
pub(crate) async fn run(
    client: FleetClient<Channel>,
    mut submissions: mpsc::Receiver<Submission>,
    open_timeout: Duration,
) {
    // Empty whenever no stream is open: a stream that ends fails every hit it held.
    let mut gathered = Gathered::default();
    loop {
        let Some(jobs) = submissions.recv().await else {
            return;
        };
        gather(&mut gathered, jobs);
        // A caller that gave up while its hit was queued (behind an open that failed
        // slowly) needs no stream.
        drop_unwanted(&mut gathered);
        if gathered.is_empty() {
            continue;
        }
        let (requests, replies) = match open(&client, open_timeout).await {
            Ok(opened) => opened,
            Err(error) => {
                // Every hit waiting for this stream gets its error; the next hit tries
                // again.
                while let Ok(jobs) = submissions.try_recv() {
                    gather(&mut gathered, jobs);
                }
                gathered.fail_all(&error);
                continue;
            }
        };
        let mut stream = OpenStream::new(requests);
        match stream.carry(&mut gathered, &mut submissions, replies).await {
            Ended::ClientsGone => return,
            Ended::Broken(error) => {
                stream.fail_all(&error);
                gathered.fail_all(&error);
            }
        }
    }
}

fn gather(gathered: &mut Gathered, jobs: Submission) {
    let now = Instant::now();
    for job in jobs {
        gathered.push(job, now);
    }
}

/// Lets every task already queued to run on this thread run first (the callers a reply
/// just answered): this task wakes itself and returns pending, which puts it at the back of
/// the runtime's queue, behind them; their submissions then find it already woken.
/// (`tokio::task::yield_now` would not do: on a multi-thread runtime it ends at the first
/// wake, the first caller's submission, leaving the others for the frame after.)
async fn let_woken_tasks_run() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await;
}

/// Gathers the submissions already waiting, while the task holds fewer than
/// [`HITS_HELD_MAX`] hits (`pending` of them sent and unanswered).
fn gather_waiting(
    gathered: &mut Gathered,
    submissions: &mut mpsc::Receiver<Submission>,
    pending: usize,
) {
    while gathered.len() + pending < HITS_HELD_MAX {
        let Ok(jobs) = submissions.try_recv() else {
            break;
        };
        gather(gathered, jobs);
    }
}

fn drop_unwanted(gathered: &mut Gathered) {
    let now = Instant::now();
    let jobs = std::mem::take(&mut gathered.jobs);
    *gathered = Gathered::default();
    for job in jobs.into_iter().filter_map(|job| job.still_wanted(now)) {
        gathered.push(job, now);
    }
}

type Opened = (
    mpsc::UnboundedSender<pb::HitBatchRequest>,
    Streaming<pb::HitBatchReply>,
);

async fn open(client: &FleetClient<Channel>, open_timeout: Duration) -> Result<Opened, Error> {
    let (requests, outgoing) = mpsc::unbounded_channel();
    let mut opener = client.clone();
    let outgoing = tokio_stream::wrappers::UnboundedReceiverStream::new(outgoing);
    match tokio::time::timeout(open_timeout, opener.hit_batch(outgoing)).await {
        Ok(Ok(response)) => Ok((requests, response.into_inner())),
        Ok(Err(status)) => Err(Error::from(status)),
        Err(_) => Err(Error::Unavailable(format!(
            "no stream within {open_timeout:?}"
        ))),
    }
}

/// How a stream's work ended.
enum Ended {
    /// Every clone is gone and every hit answered.
    ClientsGone,
    /// The stream failed; the hits on it get this error.
    Broken(Error),
}

/// A hit sent and not answered yet.
struct Waiter {
    reply: oneshot::Sender<Result<pb::HitResponse, Error>>,
    budget: Duration,
    frame: u64,
}

/// One open `HitBatch` stream: the hits sent on it, by id, and its frames in flight.
struct OpenStream {
    requests: mpsc::UnboundedSender<pb::HitBatchRequest>,
    /// Removed when answered, at the deadline, or when the stream breaks.
    pending: HashMap<u64, Waiter>,
    /// Each frame in flight and how many of its hits are still pending. A frame is
    /// answered when none is: every hit of it answered or past its deadline.
    ///
    /// One frame in flight at a time (besides full ones and those whose hits waited their
    /// share): the next frame gathers for as long as the node takes to answer the last,
    /// which a caller waits for anyway, and the node then decides many hits as one unit
    /// (a frame's fleet hits with one timeout are one Raft proposal).
    frames: HashMap<u64, usize>,
    /// Pending hits by deadline (answered ones are skipped as they come up).
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    next_id: u64,
    next_frame: u64,
}

impl OpenStream {
    fn new(requests: mpsc::UnboundedSender<pb::HitBatchRequest>) -> OpenStream {
        OpenStream {
            requests,
            pending: HashMap::new(),
            frames: HashMap::new(),
            deadlines: BinaryHeap::new(),
            next_id: 0,
            next_frame: 0,
        }
    }

    /// Takes hits, sends frames and hands out answers until the stream breaks or every
    /// clone is gone and every hit answered.
    async fn carry(
        &mut self,
        gathered: &mut Gathered,
        submissions: &mut mpsc::Receiver<Submission>,
        mut replies: Streaming<pb::HitBatchReply>,
    ) -> Ended {
        let mut accepting = true;
        loop {
            if let Err(error) = self.send_ready(gathered, !accepting) {
                return Ended::Broken(error);
            }
            if !accepting && self.pending.is_empty() {
                return Ended::ClientsGone;
            }
            let room = self.pending.len() + gathered.len() < HITS_HELD_MAX;
            // A branch's future is built even when the branch is off.
            let idle = Instant::now() + Duration::from_secs(3600);
            let next_deadline = self.deadlines.peek().map(|Reverse((at, _))| *at);
            let flush_at = gathered.flush_at;
            tokio::select! {
                biased;
                jobs = submissions.recv(), if accepting && room => match jobs {
                    // Every hit handed over before an answer is read goes into the next
                    // frame (this branch comes first): a frame answered sends them all.
                    Some(jobs) => {
                        gather(gathered, jobs);
                        gather_waiting(gathered, submissions, self.pending.len());
                    }
                    None => accepting = false,
                },
                reply = replies.next() => match reply {
                    Some(Ok(reply)) => {
                        let in_flight = !self.frames.is_empty();
                        self.answer(reply);
                        if accepting && in_flight && self.frames.is_empty() {
                            // The next frame leaves now: callers this reply answered that
                            // hit again at once join it, or closed-loop callers would split
                            // into two groups taking turns, each frame carrying half.
                            let_woken_tasks_run().await;
                            gather_waiting(gathered, submissions, self.pending.len());
                        }
                    }
                    Some(Err(status)) => {
                        // Not the status itself: it says nothing of the hits (a
                        // stream ended INVALID_ARGUMENT did not refuse them).
                        return Ended::Broken(Error::Unavailable(format!(
                            "the hit stream broke: {:?}: {}",
                            status.code(),
                            status.message()
                        )));
                    }
                    None => {
                        return Ended::Broken(Error::Unavailable(
                            "the node closed the hit stream".to_owned(),
                        ));
                    }
                },
                () = tokio::time::sleep_until(next_deadline.unwrap_or(idle)),
                    if next_deadline.is_some() => self.expire(Instant::now()),
                // Only wakes the loop: `send_ready` sends what waited its share.
                () = tokio::time::sleep_until(flush_at.unwrap_or(idle)), if flush_at.is_some() => {}
            }
        }
    }

    /// Sends gathered hits as frames, as far as the rules allow: with no frame in flight,
    /// a full frame, hits that waited their share, or (`closing`) every one.
    fn send_ready(&mut self, gathered: &mut Gathered, closing: bool) -> Result<(), Error> {
        let now = Instant::now();
        let flush = gathered.flush_due(now) || closing;
        while !gathered.is_empty() && (flush || self.frames.is_empty() || gathered.has_full_frame())
        {
            let frame = gathered.take_frame(now);
            self.send(frame, now)?;
        }
        Ok(())
    }

    /// Sends `jobs` as one frame, each hit with what is left of its deadline.
    fn send(&mut self, jobs: Vec<Job>, now: Instant) -> Result<(), Error> {
        if jobs.is_empty() {
            return Ok(());
        }
        let frame = self.next_frame;
        self.next_frame += 1;
        let mut hits = Vec::with_capacity(jobs.len());
        for job in jobs {
            let id = self.next_id;
            self.next_id += 1;
            let mut request = job.request;
            request.timeout_ms = node_timeout_ms(job.deadline.saturating_duration_since(now));
            hits.push(pb::BatchedHit {
                id,
                hit: Some(request),
            });
            self.deadlines.push(Reverse((job.deadline, id)));
            let waiter = Waiter {
                reply: job.reply,
                budget: job.budget,
                frame,
            };
            self.pending.insert(id, waiter);
        }
        self.frames.insert(frame, hits.len());
        self.requests
            .send(pb::HitBatchRequest { hits })
            .map_err(|_| Error::Unavailable("the hit stream closed".to_owned()))
    }

    /// Hands each answer to its hit. An answer to no pending hit is dropped: its hit's
    /// deadline passed.
    fn answer(&mut self, reply: pb::HitBatchReply) {
        for answer in reply.answers {
            if let Some(waiter) = self.settled(answer.id) {
                let _ = waiter.reply.send(result_of(answer.result));
            }
        }
    }

    /// Answers `Timeout` to every hit whose deadline is at or before `now`.
    fn expire(&mut self, now: Instant) {
        while let Some(Reverse((deadline, id))) = self.deadlines.peek().copied() {
            if deadline > now {
                break;
            }
            self.deadlines.pop();
            if let Some(waiter) = self.settled(id) {
                let _ = waiter.reply.send(Err(Error::Timeout(waiter.budget)));
            }
        }
        // Answered hits leave their deadlines behind: drop them before they outnumber
        // the pending ones (a deadline may be days away).
        if self.deadlines.len() > 2 * self.pending.len() + HITS_HELD_MAX {
            let pending = &self.pending;
            self.deadlines
                .retain(|Reverse((_, id))| pending.contains_key(id));
        }
    }

    /// Takes hit `id` out of the pending ones, and its frame out of those in flight once
    /// none of its hits is pending.
    fn settled(&mut self, id: u64) -> Option<Waiter> {
        let waiter = self.pending.remove(&id)?;
        if let Some(left) = self.frames.get_mut(&waiter.frame) {
            *left -= 1;
            if *left == 0 {
                self.frames.remove(&waiter.frame);
            }
        }
        Some(waiter)
    }

    fn fail_all(&mut self, error: &Error) {
        for (_, waiter) in self.pending.drain() {
            let _ = waiter.reply.send(Err(error.clone()));
        }
        self.frames.clear();
        self.deadlines.clear();
    }
}

fn result_of(result: Option<pb::batched_answer::Result>) -> Result<pb::HitResponse, Error> {
    match result {
        Some(pb::batched_answer::Result::Response(response)) => Ok(response),
        Some(pb::batched_answer::Result::Error(error)) => {
            let code = tonic::Code::from(i32::try_from(error.code).unwrap_or(i32::MAX));
            Err(Error::from(tonic::Status::new(code, error.message)))
        }
        None => Err(Error::Protocol(
            "a batch answer with neither response nor error".to_owned(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hit of about `bytes` bytes (a claim key that long).
    fn job(bytes: usize, deadline: Instant) -> Result<(Job, Answer), Error> {
        let request = pb::HitRequest {
            claim: Some(pb::Claim {
                key: "k".repeat(bytes),
                ..Default::default()
            }),
            ..Default::default()
        };
        Job::new(request, deadline, Duration::from_secs(60))
    }

    #[test]
    fn a_hit_larger_than_the_node_takes_is_refused_before_it_is_sent() {
        let deadline = Instant::now() + Duration::from_secs(60);
        assert!(job(HIT_BYTES_MAX - 100, deadline).is_ok());
        let refused = job(HIT_BYTES_MAX, deadline).map(|_| ());
        assert!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "{refused:?}"
        );
    }

    /// Gathered hits leave in frames within both caps, oldest first; a hit whose caller
    /// left is not sent, and one past its deadline is answered `Timeout`.
    #[tokio::test]
    async fn frames_hold_at_most_the_caps() {
        let now = Instant::now();
        let deadline = now + Duration::from_secs(60);
        let mut gathered = Gathered::default();
        let mut answers = Vec::new();
        // 100 hits of 15 KiB: the byte cap holds 63 of them.
        for _ in 0..100 {
            let (job, answer) = job(15 * 1024, deadline).expect("a hit");
            gathered.push(job, now);
            answers.push(answer);
        }
        assert!(gathered.has_full_frame());
        let frame = gathered.take_frame(now);
        let frame_bytes: usize = frame.iter().map(|job| job.bytes).sum();
        assert_eq!(frame.len(), FRAME_BYTES_MAX / frame[0].bytes);
        assert!(frame_bytes <= FRAME_BYTES_MAX, "{frame_bytes}");
        assert_eq!(gathered.len(), 100 - frame.len());

        let mut gathered = Gathered::default();
        for _ in 0..FRAME_HITS_MAX + 10 {
            let (job, answer) = job(10, deadline).expect("a hit");
            gathered.push(job, now);
            answers.push(answer);
        }
        assert!(gathered.has_full_frame());
        assert_eq!(gathered.take_frame(now).len(), FRAME_HITS_MAX);
        assert!(!gathered.has_full_frame());

        let mut gathered = Gathered::default();
        let (gone, answer) = job(10, deadline).expect("a hit");
        drop(answer);
        let (late, mut late_answer) = job(10, now + Duration::from_millis(1)).expect("a hit");
        let (wanted, _answer) = job(10, deadline).expect("a hit");
        for job in [gone, late, wanted] {
            gathered.push(job, now);
        }
        let frame = gathered.take_frame(now + Duration::from_millis(2));
        assert_eq!(frame.len(), 1);
        assert_eq!(frame[0].deadline, deadline);
        assert!(matches!(late_answer.try_recv(), Ok(Err(Error::Timeout(_)))));
        assert!(gathered.is_empty() && gathered.flush_at.is_none());
    }
}
