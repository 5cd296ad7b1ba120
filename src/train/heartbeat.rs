//! A process's heartbeat (`train --heartbeat ADDR:PORT`, given by `dptrain launch`): a UDP
//! datagram to the supervisor every [`INTERVAL`], from a thread of its own, with the process's
//! MPI rank and the steps it has done.
//!
//! Why a thread and a datagram: a rank whose peer died is blocked in a collective until
//! `--comm-timeout`, but its heartbeat thread still beats, while a host that is gone or frozen
//! falls silent. The supervisor therefore names the lost host within its heartbeat timeout
//! (seconds), long before the survivors' collectives give up. It is the control plane only
//! (gradients never leave MPI); the supervisor is not an MPI rank, so MPI cannot carry it,
//! and torchrun's rendezvous store and Horovod's driver service talk to their workers over
//! their own sockets likewise. A datagram lost on the way is only a late beat.
//!
//! The message is one line of text: `dptrain-heartbeat 1 RANK STEPS` (STEPS: global steps
//! done, `-` before the first). [`Beat::parse`] is the supervisor's reader of it.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Time between two beats.
pub const INTERVAL: Duration = Duration::from_millis(250);

/// `steps` before this process has finished a step (any step done makes it at least 1).
const NO_STEP: usize = 0;

/// Global steps this process has seen done (its data position), for its heartbeat: one per
/// process, as the heartbeat is.
static STEPS_DONE: AtomicUsize = AtomicUsize::new(NO_STEP);

/// The run's progress: `steps` global steps done (the count only rises).
pub fn record_steps_done(steps: usize) {
    STEPS_DONE.fetch_max(steps, Ordering::Relaxed);
}

/// One heartbeat as the supervisor reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// The sender's MPI rank.
    pub rank: usize,
    /// Global steps done by then, if any.
    pub steps: Option<usize>,
}

impl Beat {
    /// The datagram of this beat.
    pub fn to_message(self) -> String {
        match self.steps {
            Some(s) => format!("dptrain-heartbeat 1 {} {s}", self.rank),
            None => format!("dptrain-heartbeat 1 {} -", self.rank),
        }
    }

    /// A datagram read back; `None` for anything that is not a heartbeat of this version.
    pub fn parse(bytes: &[u8]) -> Option<Beat> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut words = text.split_ascii_whitespace();
        if words.next()? != "dptrain-heartbeat" || words.next()? != "1" {
            return None;
        }
        let rank = words.next()?.parse().ok()?;
        let steps = match words.next()? {
            "-" => None,
            n => Some(n.parse().ok()?),
        };
        words.next().is_none().then_some(Beat { rank, steps })
    }
}

/// The heartbeat thread of this process, beating until dropped: the process holds it from
/// before training starts until MPI is finalised, so a rank that has finished training and
/// waits for the others is not taken for a lost one.
pub struct Heartbeat {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    /// Starts beating to `to` as `rank`.
    pub fn start(to: SocketAddr, rank: usize) -> std::io::Result<Self> {
        let bind: SocketAddr = if to.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(bind)?;
        socket.connect(to)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    let done = STEPS_DONE.load(Ordering::Relaxed);
                    let beat = Beat {
                        rank,
                        steps: (done != NO_STEP).then_some(done),
                    };
                    // Not there yet, or a full buffer: the next beat is as good.
                    let _ = socket.send(beat.to_message().as_bytes());
                    std::thread::park_timeout(INTERVAL);
                }
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beats_round_trip_and_strangers_are_ignored() {
        for beat in [
            Beat {
                rank: 3,
                steps: Some(120),
            },
            Beat {
                rank: 0,
                steps: None,
            },
        ] {
            assert_eq!(Beat::parse(beat.to_message().as_bytes()), Some(beat));
        }
        for junk in [
            &b"dptrain-heartbeat 2 1 5"[..],
            b"dptrain-heartbeat 1 x 5",
            b"dptrain-heartbeat 1 1 5 6",
            b"hello",
            b"\xff\xfe",
        ] {
            assert_eq!(Beat::parse(junk), None);
        }
    }

    #[test]
    fn a_heartbeat_reaches_its_listener_with_the_steps_done() {
        let listener = UdpSocket::bind("127.0.0.1:0").unwrap();
        listener
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let hb = Heartbeat::start(listener.local_addr().unwrap(), 2).unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(Beat::parse(&buf[..n]).unwrap().rank, 2);
        record_steps_done(7);
        let seen = (0..40).find_map(|_| {
            let n = listener.recv(&mut buf).ok()?;
            Beat::parse(&buf[..n]).filter(|b| b.steps.is_some_and(|s| s >= 7))
        });
        drop(hb);
        assert!(seen.is_some(), "no beat carried the steps done");
    }
}
