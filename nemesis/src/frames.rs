//! The workload's `--frames` mode: the claims of one node's clients travel together on one
//! `HitBatch` stream to that node. One task per node owns the stream; the claims that
//! queued while a frame was in flight leave as the next frame, each with an id of its own, and each
//! answer goes back to its client by id. So the checkers see a frame's hits decided one by
//! one, as the edge's batched path decides them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::Status;

use ankusa_fleet::pb;
use ankusa_fleet::pb::fleet_client::FleetClient;

/// A claim's answer, or the status its call ended with.
type Answered = Result<pb::HitResponse, Status>;

/// The longest a claim waits for the frame in flight to be answered before it leaves in a
/// frame of its own: a third of a call's deadline.
const GATHER_MAX: Duration = Duration::from_millis(super::workload::CALL_TIMEOUT_MS / 3);

/// Claims queued at once for one node's stream (its clients wait for their answer, so a
/// few per client at most).
const QUEUED_MAX: usize = 256;

/// The handle a node's clients send their claims through; cheap to clone.
#[derive(Clone)]
pub struct Frames {
    queue: mpsc::Sender<(pb::HitRequest, oneshot::Sender<Answered>)>,
    sent: Arc<Sent>,
}

/// What the frames carried, for the report: it shows the hits really shared frames.
#[derive(Debug, Default)]
pub struct Sent {
    pub frames: AtomicU64,
    pub hits: AtomicU64,
    /// Hits in the largest frame.
    pub largest: AtomicU64,
}

impl Frames {
    /// Starts the task that owns the stream to the node at `api_addr` (connected when the
    /// first claim comes); it ends when every handle is dropped.
    ///
    /// # Errors
    /// When `api_addr` does not make an endpoint.
    pub fn connect(api_addr: &str) -> Result<Frames, tonic::transport::Error> {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{api_addr}"))?
            .connect_timeout(std::time::Duration::from_millis(
                super::workload::CALL_TIMEOUT_MS,
            ));
        let (queue, queued) = mpsc::channel(QUEUED_MAX);
        let sent = Arc::new(Sent::default());
        tokio::spawn(run(
            FleetClient::new(endpoint.connect_lazy()),
            queued,
            sent.clone(),
        ));
        Ok(Frames { queue, sent })
    }

    /// What this node's stream carried so far.
    pub fn sent(&self) -> &Sent {
        &self.sent
    }

    /// Sends `request` in the next frame and waits for its answer.
    pub async fn hit(&self, request: pb::HitRequest) -> Answered {
        let (answer, answered) = oneshot::channel();
        self.queue
            .send((request, answer))
            .await
            .map_err(|_| Status::unavailable("the frame task ended"))?;
        answered
            .await
            .unwrap_or_else(|_| Err(Status::unknown("the stream ended before the answer")))
    }
}

/// One open `HitBatch` stream: frames go in, replies come out.
struct Open {
    frames: mpsc::Sender<pb::HitBatchRequest>,
    replies: tonic::Streaming<pb::HitBatchReply>,
}

/// A claim waiting to leave: its request, its answer's channel, and when it was queued.
type Gathered = (pb::HitRequest, oneshot::Sender<Answered>, Instant);

async fn run(
    mut client: FleetClient<Channel>,
    mut queued: mpsc::Receiver<(pb::HitRequest, oneshot::Sender<Answered>)>,
    sent: Arc<Sent>,
) {
    let mut open: Option<Open> = None;
    let mut waiting: HashMap<u64, oneshot::Sender<Answered>> = HashMap::new();
    let mut gathered: Vec<Gathered> = Vec::new();
    let mut next_id = 0u64;
    loop {
        let reply = async {
            match open.as_mut() {
                Some(open) => open.replies.message().await,
                None => std::future::pending().await,
            }
        };
        let oldest = gathered.first().map(|(_, _, at)| *at + GATHER_MAX);
        let mut due = false;
        tokio::select! {
            next = queued.recv() => {
                let Some((hit, answer)) = next else { return };
                gathered.push((hit, answer, Instant::now()));
                while let Ok((hit, answer)) = queued.try_recv() {
                    gathered.push((hit, answer, Instant::now()));
                }
            }
            reply = reply => match reply {
                Ok(Some(reply)) => {
                    for answer in reply.answers {
                        let (id, result) = ankusa_fleet::api::batch::answer_result(answer);
                        if let Some(waiter) = waiting.remove(&id) {
                            let _ = waiter.send(result);
                        }
                    }
                }
                Ok(None) => {
                    open = None;
                    fail_all(&mut waiting, &Status::unknown("the hit batch stream ended"));
                }
                Err(status) => {
                    open = None;
                    fail_all(&mut waiting, &status);
                }
            },
            () = sleep_until_some(oldest) => due = true,
        }
        // A frame leaves when nothing is in flight, or when its oldest claim waited long
        // enough (a paused node may never answer the one in flight).
        if gathered.is_empty() || !(waiting.is_empty() || due) {
            continue;
        }
        if open.is_none() {
            match start_stream(&mut client).await {
                Ok(started) => open = Some(started),
                Err(status) => {
                    // Nothing was sent: each claim ends with the connect error.
                    for (_, answer, _) in gathered.drain(..) {
                        let _ = answer.send(Err(status.clone()));
                    }
                    continue;
                }
            }
        }
        let mut hits = Vec::with_capacity(gathered.len());
        for (mut hit, answer, queued_at) in gathered.drain(..) {
            // The node's deadline is what is left of the claim's own.
            let waited = u32::try_from(queued_at.elapsed().as_millis()).unwrap_or(u32::MAX);
            hit.timeout_ms = hit.timeout_ms.saturating_sub(waited).max(1);
            next_id += 1;
            waiting.insert(next_id, answer);
            hits.push(pb::BatchedHit {
                id: next_id,
                hit: Some(hit),
            });
        }
        let count = hits.len() as u64;
        let delivered = match open.as_ref() {
            Some(open) => open.frames.send(pb::HitBatchRequest { hits }).await.is_ok(),
            None => false,
        };
        if delivered {
            sent.frames.fetch_add(1, Ordering::Relaxed);
            sent.hits.fetch_add(count, Ordering::Relaxed);
            sent.largest.fetch_max(count, Ordering::Relaxed);
        } else {
            open = None;
            fail_all(
                &mut waiting,
                &Status::unknown("the hit batch stream closed"),
            );
        }
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn start_stream(client: &mut FleetClient<Channel>) -> Result<Open, Status> {
    let (frames, outgoing) = mpsc::channel(16);
    let replies = client
        .hit_batch(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await?
        .into_inner();
    Ok(Open { frames, replies })
}

/// The stream broke with hits in flight: each may or may not have been decided.
fn fail_all(waiting: &mut HashMap<u64, oneshot::Sender<Answered>>, status: &Status) {
    for (_, waiter) in waiting.drain() {
        let _ = waiter.send(Err(Status::unknown(format!(
            "the hit batch stream broke: {}",
            status.message()
        ))));
    }
}
