//! The drain gate of the edge API: once a node is told to stop (SIGTERM, SIGINT), new calls
//! are refused with `UNAVAILABLE` (the edge retries on another node) while the calls already
//! inside are answered within their own deadlines.
//!
//! It only counts and refuses; stopping the servers and flushing the stores is `server`'s.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

/// A call refused because the node is draining (`UNAVAILABLE`, in `api::status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this node is shutting down; send the call to another node")]
pub struct Draining;

/// Shared by every edge call of one node (cheap to clone).
#[derive(Clone, Default)]
pub struct DrainGate {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    draining: AtomicBool,
    in_flight: AtomicUsize,
    idle: Notify,
}

/// One call inside the gate; dropping it lets a drain finish.
pub struct CallGuard {
    inner: Arc<Inner>,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if self.inner.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.inner.idle.notify_waiters();
        }
    }
}

impl DrainGate {
    /// Lets a call in, unless the node is draining.
    ///
    /// # Errors
    /// [`Draining`] once a drain has begun.
    pub fn enter(&self) -> Result<CallGuard, Draining> {
        // Counted first: a drain that begins between the two steps still waits for it.
        // SeqCst on both sides (count then flag here, flag then count in a drain): either
        // this call sees the flag, or the drain sees the count.
        self.inner.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = CallGuard {
            inner: Arc::clone(&self.inner),
        };
        if self.inner.draining.load(Ordering::SeqCst) {
            return Err(Draining);
        }
        Ok(guard)
    }

    /// Refuses every call from now on.
    pub fn begin(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
    }

    /// True once [`DrainGate::begin`] was called.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::SeqCst)
    }

    /// Calls inside the gate now.
    pub fn in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::SeqCst)
    }

    /// Waits until no call is inside, at most `timeout`; false if some still were.
    pub async fn until_idle(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Registered before the count is read, so a last call leaving in between wakes it.
            let idle = self.inner.idle.notified();
            if self.in_flight() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.in_flight() == 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_drain_refuses_new_calls_and_waits_for_those_inside() {
        let gate = DrainGate::default();
        let inside = gate.enter().expect("open");
        gate.begin();
        let refused = gate.enter().err().expect("refused while draining");
        assert_eq!(
            tonic::Status::from(refused).code(),
            tonic::Code::Unavailable
        );
        assert!(!gate.until_idle(Duration::from_millis(20)).await);
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.until_idle(Duration::from_secs(30)).await }
        });
        drop(inside);
        assert!(waiter.await.expect("join"), "idle once the last call left");
        assert_eq!(gate.in_flight(), 0);
    }
}
