//! Error type shared by the transport and every collective.
//!
//! Messages name the rank that saw the problem, the peer involved and the
//! message tag, because with N worker threads a bare "timed out" is useless:
//! the operator needs to know which link stalled and what knob to turn.

use std::time::Duration;

/// Everything that can go wrong while moving or reducing gradients.
#[derive(thiserror::Error, Debug, Clone)]
pub enum CommError {
    /// No message with the wanted tag arrived from `from` within the
    /// transport's timeout.
    #[error(
        "rank {rank} waited {waited:?} for a message from rank {from} (tag {tag}): \
         the peer may have died or stalled; raise --comm-timeout if steps (or worker 0's \
         evaluation and checkpoint between epochs) are legitimately this slow"
    )]
    Timeout {
        /// Rank that was waiting.
        rank: usize,
        /// Rank it was waiting for.
        from: usize,
        /// Tag it was waiting for.
        tag: u64,
        /// How long it actually waited before giving up.
        waited: Duration,
    },

    /// The emulated link would make a message wait longer than the timeout: the send (its
    /// queue and transmit time) or its arrival (plus latency) lies past the deadline. Reported
    /// at once instead of after sleeping that long, so an absurd link (`--link-bandwidth 1bit`)
    /// cannot hang a run.
    #[error(
        "rank {rank}: the emulated link needs {needed:.3?} to move {bytes} bytes {} rank {peer} \
         (tag {tag}), counted from the start of the {}, longer than its timeout ({timeout:?}, \
         from --comm-timeout): a step would never finish in time; raise the link's bandwidth \
         (--link-bandwidth, or --intra-bandwidth for the port within a process), lower its \
         latency or raise --comm-timeout",
        if *receiving { "from" } else { "to" },
        if *receiving { "receive's wait (it waited for the sender too)" } else { "send" }
    )]
    LinkTooSlow {
        /// Rank that saw it.
        rank: usize,
        /// The other end of the message.
        peer: usize,
        /// Whether `rank` was receiving it (from `peer`), not sending it (to `peer`).
        receiving: bool,
        /// Message tag.
        tag: u64,
        /// Message size.
        bytes: usize,
        /// How long the send or receive would take in all, from its start: for a send its
        /// queue and transmit time, for a receive the wait so far plus the rest until the
        /// message arrives (a receive that began 41 s before a 60 s latency message was sent
        /// needs 101 s, which is what passes a 100 s timeout, not the 60 s left).
        needed: Duration,
        /// The transport's timeout.
        timeout: Duration,
    },

    /// The peer's endpoint was dropped (its thread exited or panicked), so
    /// the message can never arrive / be delivered.
    #[error(
        "rank {rank}: peer rank {peer} is gone (its endpoint was dropped) while \
         exchanging tag {tag}: that worker exited or panicked early; look for \
         the first error it reported"
    )]
    PeerGone {
        /// Rank that noticed.
        rank: usize,
        /// Rank whose endpoint disappeared.
        peer: usize,
        /// Tag of the message being sent or awaited.
        tag: u64,
    },

    /// A message arrived with a different length than the receiver expected.
    #[error(
        "rank {rank} expected {expected} floats from rank {from} (tag {tag}) but got \
         {got}: ranks disagree about the buffer size; all ranks must call the \
         collective with identically sized buffers (same model, same bucket layout)"
    )]
    SizeMismatch {
        /// Receiving rank.
        rank: usize,
        /// Sending rank.
        from: usize,
        /// Message tag.
        tag: u64,
        /// Length the receiver asked for.
        expected: usize,
        /// Length that actually arrived.
        got: usize,
    },

    /// A rank index outside `0..world` was used as peer or root.
    #[error(
        "rank {rank}: peer/root rank {peer} is out of range for a world of {world} \
         ranks; this is a bug in the caller (ranks are 0..world)"
    )]
    InvalidRank {
        /// Rank that made the call.
        rank: usize,
        /// Offending rank index.
        peer: usize,
        /// World size.
        world: usize,
    },

    /// The transport cannot do what was asked (e.g. a native all-reduce in-process).
    #[error("this transport does not support {what}")]
    Unsupported {
        /// What was asked for.
        what: &'static str,
    },

    /// The transport itself reported an error (e.g. an MPI call failed).
    #[error("rank {rank}: {detail}")]
    Transport {
        /// Rank that saw it.
        rank: usize,
        /// What happened.
        detail: String,
    },

    /// A value too large for the wire format (`--compress fp16`: largest 65504).
    #[error(
        "rank {rank}: a gradient value of {value:e} does not fit the {format} wire format \
         (largest 65504): train with --compress bf16 (16 bits with f32's range) or none"
    )]
    WireOverflow {
        /// Rank that was sending.
        rank: usize,
        /// The wire format's name (`fp16`).
        format: &'static str,
        /// The first value past its range.
        value: f32,
    },

    /// A worker's communication thread panicked while running a collective (caught there).
    #[error("communication thread panicked: {0}")]
    ThreadPanicked(String),

    /// The worker asked its communication thread for more work after that thread had failed.
    #[error("the communication thread failed earlier")]
    ThreadFailedEarlier,

    /// The worker's communication thread is no longer there to take or return work.
    #[error("the communication thread stopped (a peer failed; see the first error)")]
    ThreadStopped,
}

impl CommError {
    /// True when this failure only echoes another worker's: that worker's endpoint went away
    /// (it failed, and its failure is the cause). A run reports the cause, not its echoes.
    pub fn is_echo(&self) -> bool {
        matches!(self, Self::PeerGone { .. })
    }
}
