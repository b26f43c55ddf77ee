//! Which senders a leader's next entry waits for (docs/decisions/028).
//!
//! A frame or forward of two or more commands *returns* ([`Queued::returns`]): its sender
//! gathered while it was in flight and sends its next one as soon as it is answered. The
//! entry after it waits for each such sender that came back within the linger last time.
//! One that took longer (a follower across a slow link, an edge whose load stopped) is not
//! waited for until it comes back in time again: waiting for it would cost every other
//! entry the whole linger and gain nothing.

use std::time::Duration;

use tokio::time::Instant;

use super::{Origin, Queued};

/// The most senders remembered: a fleet's voters and learners and the local edge, with
/// room to spare. Past it the one answered longest ago is forgotten.
const ORIGINS_KEPT: usize = 32;

/// The senders of the frames and forwards a leader's entries answered.
#[derive(Debug, Default)]
pub(super) struct Origins {
    known: Vec<Known>,
}

/// Where a sender's last unit is, as of the last entry made or answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// In the last entry made, not yet answered.
    InFlight,
    /// In the last entry answered.
    JustAnswered,
    /// In an entry before that.
    Earlier,
}

#[derive(Debug)]
struct Known {
    origin: Origin,
    phase: Phase,
    /// When the entry that held its last unit was answered (its task's time, set before
    /// it freed the slot).
    answered: Option<Instant>,
    /// Whether its last unit sent after an answer came within the linger of it.
    prompt: bool,
}

impl Origins {
    /// The last entry made was answered at `now`.
    pub(super) fn answered(&mut self, now: Instant) {
        for known in &mut self.known {
            known.phase = match known.phase {
                Phase::InFlight => {
                    known.answered = Some(now);
                    Phase::JustAnswered
                }
                Phase::JustAnswered | Phase::Earlier => Phase::Earlier,
            };
        }
    }

    /// The senders to wait for: those whose units the last entry answered, and that came
    /// back within the linger last time.
    pub(super) fn awaited(&self) -> Vec<Origin> {
        self.known
            .iter()
            .filter(|known| known.phase == Phase::JustAnswered && known.prompt)
            .map(|known| known.origin)
            .collect()
    }

    /// Records an entry just made of `units`: each returning sender in it, and whether it
    /// came back within `linger` of its last unit's answer.
    pub(super) fn made(&mut self, units: &[Queued], linger: Duration) {
        for unit in units.iter().filter(|unit| unit.returns()) {
            let index = match self
                .known
                .iter()
                .position(|known| known.origin == unit.origin)
            {
                Some(index) => index,
                None => self.remember(unit.origin),
            };
            let known = &mut self.known[index];
            if known.phase == Phase::InFlight {
                // A second unit of the same sender in one entry.
                continue;
            }
            match known.answered {
                None => known.prompt = true,
                // Sent before that answer (a follower with a second forward in flight):
                // it says nothing of how soon the sender comes back.
                Some(answered) if unit.arrived < answered => {}
                Some(answered) => known.prompt = unit.arrived - answered <= linger,
            }
            known.phase = Phase::InFlight;
        }
    }

    /// How many senders are remembered.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.known.len()
    }

    /// Whether `origin` is remembered.
    #[cfg(test)]
    pub(super) fn knows(&self, origin: Origin) -> bool {
        self.known.iter().any(|known| known.origin == origin)
    }

    /// Adds `origin`, first forgetting the sender answered longest ago when full (never
    /// one of the entry being recorded); its index.
    fn remember(&mut self, origin: Origin) -> usize {
        while self.known.len() >= ORIGINS_KEPT {
            let oldest = (0..self.known.len())
                .filter(|&i| self.known[i].phase != Phase::InFlight)
                .min_by_key(|&i| self.known[i].answered);
            let Some(oldest) = oldest else {
                break;
            };
            self.known.swap_remove(oldest);
        }
        self.known.push(Known {
            origin,
            phase: Phase::Earlier,
            answered: None,
            prompt: true,
        });
        self.known.len() - 1
    }
}
