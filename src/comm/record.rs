//! Recording a collective's message schedule by running the real algorithm.
//!
//! Why: the simulator (`crate::sim`) replays every rank's sends and receives in virtual time.
//! Writing those schedules down a second time, next to the algorithms, lets the two drift
//! apart; so the simulator runs the algorithms themselves, over a transport that only notes
//! what it is asked to do.
//!
//! How: every collective here decides whom to send what from ranks and buffer lengths alone,
//! never from the values, and a send never waits for its receiver (the [`Transport`]
//! contract). So one rank's program can be recorded on its own, without its peers and without
//! threads: [`RecordingTransport::send`] notes (peer, elements) and returns at once,
//! [`RecordingTransport::recv`] notes (peer, elements) and leaves the buffer as it is (the
//! values are garbage afterwards, which the schedule does not depend on). The notes come in the
//! rank's program order: each one starts after the one before it on that rank, and the k-th
//! receive from a peer matches that peer's k-th send to this rank (FIFO per pair and tag; a
//! collective uses one tag). `tests/sim.rs` checks recordings against the traffic of real
//! threaded runs over the in-process fabric.

use std::sync::Mutex;

use crate::comm::{CommError, Transport};

/// One message in a rank's program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Event {
    /// Send `elems` f32 to rank `to`; the rank goes on once the message has left.
    Send {
        /// Destination rank.
        to: usize,
        /// Message length in f32 elements.
        elems: usize,
    },
    /// Wait for the next message from rank `from`, of `elems` f32.
    Recv {
        /// Source rank.
        from: usize,
        /// Message length in f32 elements.
        elems: usize,
    },
}

/// Why a recording failed.
#[derive(Debug)]
pub enum RecordError {
    /// The rank's program has more than `limit` messages (the caller's memory and time bound).
    TooLong {
        /// The rank being recorded.
        rank: usize,
        /// The bound.
        limit: usize,
    },
    /// The algorithm failed (e.g. the transport has no native all-reduce to record).
    Failed(CommError),
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooLong { rank, limit } => write!(
                f,
                "rank {rank}'s schedule has more than {limit} messages (the recording limit)"
            ),
            Self::Failed(e) => write!(f, "the algorithm failed while being recorded: {e}"),
        }
    }
}

/// A transport that records one rank's sends and receives instead of moving data (see the
/// module docs).
pub struct RecordingTransport {
    rank: usize,
    world: usize,
    limit: usize,
    events: Mutex<Vec<Event>>,
}

/// The detail of the error that stops an algorithm at the recording limit; recognised by
/// [`record_rank`] to report [`RecordError::TooLong`].
const TOO_LONG: &str = "recording limit reached";

impl RecordingTransport {
    /// Rank `rank` of `world`; recording stops with an error after `limit` events.
    pub fn new(world: usize, rank: usize, limit: usize) -> Self {
        Self {
            rank,
            world,
            limit,
            events: Mutex::new(Vec::new()),
        }
    }

    /// The events recorded so far, in program order.
    pub fn into_events(self) -> Vec<Event> {
        self.events.into_inner().unwrap_or_else(|e| e.into_inner())
    }

    fn note(&self, peer: usize, e: Event) -> Result<(), CommError> {
        if peer >= self.world {
            return Err(CommError::InvalidRank {
                rank: self.rank,
                peer,
                world: self.world,
            });
        }
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        if events.len() >= self.limit {
            return Err(CommError::Transport {
                rank: self.rank,
                detail: TOO_LONG.into(),
            });
        }
        events.push(e);
        Ok(())
    }
}

impl Transport for RecordingTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn send(&self, to: usize, _tag: u64, data: &[f32]) -> Result<(), CommError> {
        self.note(
            to,
            Event::Send {
                to,
                elems: data.len(),
            },
        )
    }

    fn recv(&self, from: usize, _tag: u64, out: &mut [f32]) -> Result<(), CommError> {
        self.note(
            from,
            Event::Recv {
                from,
                elems: out.len(),
            },
        )
    }
}

/// Records the programs of ranks of one collective, one rank at a time, reusing the buffer
/// and scratch between ranks (recording many ranks must not allocate a buffer each).
pub struct Recorder {
    world: usize,
    buf: Vec<f32>,
    scratch: Vec<f32>,
}

impl Recorder {
    /// A recorder for `world` ranks on buffers of `len` elements.
    pub fn new(world: usize, len: usize) -> Self {
        Self {
            world,
            buf: vec![0.0; len],
            scratch: Vec::new(),
        }
    }

    /// Records rank `rank`'s program when `run` (a collective, called as the trainer calls
    /// it: transport, buffer, scratch) runs; stops with [`RecordError::TooLong`] after `limit`
    /// events.
    pub fn record<F>(
        &mut self,
        rank: usize,
        limit: usize,
        run: F,
    ) -> Result<Vec<Event>, RecordError>
    where
        F: FnOnce(&dyn Transport, &mut [f32], &mut Vec<f32>) -> Result<(), CommError>,
    {
        let t = RecordingTransport::new(self.world, rank, limit);
        match run(&t, &mut self.buf, &mut self.scratch) {
            Ok(()) => Ok(t.into_events()),
            Err(CommError::Transport { detail, .. }) if detail == TOO_LONG => {
                Err(RecordError::TooLong { rank, limit })
            }
            Err(e) => Err(RecordError::Failed(e)),
        }
    }
}

/// Records rank `rank`'s program when `run` runs over `world` ranks on a buffer of `len`
/// elements (a [`Recorder`] for one rank).
pub fn record_rank<F>(
    world: usize,
    rank: usize,
    len: usize,
    limit: usize,
    run: F,
) -> Result<Vec<Event>, RecordError>
where
    F: FnOnce(&dyn Transport, &mut [f32], &mut Vec<f32>) -> Result<(), CommError>,
{
    Recorder::new(world, len).record(rank, limit, run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{all_reduce_sum, CommMode};

    #[test]
    fn ring_rank_program_is_send_then_receive_around_the_ring() {
        let ev = record_rank(4, 1, 8, 100, |t, b, s| {
            all_reduce_sum(CommMode::Ring, t, b, 0, s)
        })
        .unwrap();
        assert_eq!(ev.len(), 12);
        for pair in ev.chunks(2) {
            assert_eq!(pair[0], Event::Send { to: 2, elems: 2 });
            assert_eq!(pair[1], Event::Recv { from: 0, elems: 2 });
        }
    }

    #[test]
    fn the_limit_stops_a_long_schedule_with_a_clear_error() {
        let err = record_rank(1000, 0, 1000, 50, |t, b, s| {
            all_reduce_sum(CommMode::Ring, t, b, 0, s)
        })
        .unwrap_err();
        assert!(
            matches!(err, RecordError::TooLong { rank: 0, limit: 50 }),
            "{err}"
        );
        assert!(err.to_string().contains("more than 50 messages"), "{err}");
        // A transport without a native all-reduce says so.
        let err = record_rank(2, 0, 4, 50, |t, b, s| t.native_all_reduce_sum(b, s)).unwrap_err();
        assert!(err.to_string().contains("native all-reduce"), "{err}");
    }
}
