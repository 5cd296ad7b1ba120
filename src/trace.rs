//! Timeline tracing: Chrome trace-event JSON (opens in Perfetto and chrome://tracing).
//!
//! A run with `--trace FILE` makes one [`TraceSink`]: the clock (microseconds since run start)
//! and the step window (`--trace-steps a..b`). Each worker thread gets a [`Tracer`] handle that
//! collects events in its own `Vec` (no lock, no sharing while training) and hands them to the
//! sink when dropped; the run writes the file once at the end, atomically. Without `--trace` the
//! handle is [`Tracer::off`]: every method checks one bool and returns, so the hot path neither
//! allocates nor reads the clock.
//!
//! Tracks: worker `r` is tid `2r` (data wait, forward and backward per block, exposed comm,
//! update) and its communication thread is tid `2r + 1` (one span per bucket reduction, with
//! bucket index, mode and bytes). The worker records its communication thread's spans too, from
//! the start and duration the reducer already brings back with each bucket, so the
//! communication thread does no bookkeeping of its own. Flow arrows link the moment a bucket is
//! handed off during backward to its reduction.

use serde_json::{json, Value};
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Default window of traced steps (global step numbers, from 0): a few steps past warm-up.
pub const DEFAULT_STEPS: Range<usize> = 5..8;

/// Parses a step window `A..B` (global steps A to B-1, counted from 0).
pub fn parse_steps(s: &str) -> Result<Range<usize>, String> {
    let bad = || format!("bad step window '{s}': use A..B with A < B, e.g. 5..8");
    let (a, b) = s.split_once("..").ok_or_else(bad)?;
    let a: usize = a.trim().parse().map_err(|_| bad())?;
    let b: usize = b.trim().parse().map_err(|_| bad())?;
    if a >= b {
        return Err(bad());
    }
    Ok(a..b)
}

/// The track (Chrome `tid`) of worker `rank`.
pub fn worker_tid(rank: usize) -> u32 {
    2 * rank as u32
}

/// The track (Chrome `tid`) of worker `rank`'s communication thread.
pub fn comm_tid(rank: usize) -> u32 {
    2 * rank as u32 + 1
}

/// One trace event, kept in the form it is written.
#[derive(Debug, Clone)]
struct Event {
    name: String,
    cat: &'static str,
    /// Chrome phase: `X` complete span, `s`/`f` flow start/finish.
    ph: char,
    tid: u32,
    ts_us: u64,
    dur_us: u64,
    flow_id: u64,
    args: Value,
}

/// Where every thread's events end up; one per traced run.
#[derive(Debug)]
pub struct TraceSink {
    start: Instant,
    steps: Range<usize>,
    events: Mutex<Vec<Event>>,
    tracks: Mutex<Vec<(u32, String)>>,
}

impl TraceSink {
    /// A sink whose clock starts at `start` and that keeps steps in `steps`.
    pub fn new(start: Instant, steps: Range<usize>) -> Arc<Self> {
        Arc::new(Self {
            start,
            steps,
            events: Mutex::new(Vec::new()),
            tracks: Mutex::new(Vec::new()),
        })
    }

    /// A handle for one thread; `tracks` are the (tid, name) pairs it writes to.
    pub fn tracer(self: &Arc<Self>, tracks: &[(u32, String)]) -> Tracer {
        lock(&self.tracks).extend(tracks.iter().cloned());
        Tracer {
            sink: Some(self.clone()),
            events: Vec::new(),
            active: false,
            step: 0,
        }
    }

    /// Number of events handed in so far (by dropped tracers).
    pub fn len(&self) -> usize {
        lock(&self.events).len()
    }

    /// True when no events were handed in.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole trace as Chrome trace-event JSON (object form, `displayTimeUnit` ms).
    pub fn to_json(&self) -> String {
        let mut tracks = lock(&self.tracks).clone();
        tracks.sort();
        tracks.dedup();
        let mut out = Vec::new();
        out.push(json!({"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": "dptrain"}}));
        for (tid, name) in &tracks {
            out.push(json!({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": name}}));
            // Keeps each communication track right under its worker's.
            out.push(json!({"ph": "M", "pid": 1, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}}));
        }
        let mut events = lock(&self.events).clone();
        // Parents before children at equal start, so viewers and checks see them nested.
        events.sort_by_key(|e| (e.tid, e.ts_us, std::cmp::Reverse(e.dur_us)));
        for e in events {
            let mut v = json!({"name": e.name, "cat": e.cat, "ph": e.ph.to_string(), "pid": 1, "tid": e.tid, "ts": e.ts_us});
            match e.ph {
                'X' => v["dur"] = e.dur_us.into(),
                _ => {
                    v["id"] = e.flow_id.into();
                    // The arrow ends on the span that encloses the finish point.
                    if e.ph == 'f' {
                        v["bp"] = "e".into();
                    }
                }
            }
            if !e.args.is_null() {
                v["args"] = e.args;
            }
            out.push(v);
        }
        serde_json::to_string(&json!({"traceEvents": out, "displayTimeUnit": "ms"}))
            .expect("trace events serialise")
    }

    /// Writes the trace to `path` atomically (see [`crate::output`]: a regular file only, in a
    /// directory that exists, replacing only an earlier trace).
    pub fn write(&self, path: &Path) -> Result<(), String> {
        crate::output::write_atomically(path, self.to_json().as_bytes(), &TRACE_FILE)
            .map_err(|e| format!("--trace: {e}"))
    }
}

/// A trace file: its first event names the process `dptrain` (with either key order, whatever
/// serde_json's features).
pub const TRACE_FILE: crate::output::Kind = crate::output::Kind {
    what: "a trace dptrain wrote",
    head: 512,
    is_one: |head| {
        use crate::output::holds;
        holds(head, b"\"traceEvents\"")
            && holds(head, b"\"process_name\"")
            && holds(head, b"\"dptrain\"")
    },
};

/// A poisoned lock only means another thread panicked while pushing events; its events are
/// still whole, so the trace goes on.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A thread's tracing handle: collects events for the steps in the window, hands them to the
/// sink when dropped. A no-op (no clock reads, no allocation) when tracing is off or the
/// current step is outside the window.
#[derive(Debug, Default)]
pub struct Tracer {
    sink: Option<Arc<TraceSink>>,
    events: Vec<Event>,
    active: bool,
    step: usize,
}

impl Tracer {
    /// The handle of an untraced run.
    pub fn off() -> Self {
        Self::default()
    }

    /// Starts global step `step`: events are kept only if it lies in the window.
    pub fn begin_step(&mut self, step: usize) {
        self.step = step;
        self.active = self.sink.as_ref().is_some_and(|s| s.steps.contains(&step));
    }

    /// True while the current step is traced (callers skip reading the clock otherwise).
    #[inline]
    pub fn active(&self) -> bool {
        self.active
    }

    /// The current global step.
    pub fn step(&self) -> usize {
        self.step
    }

    fn us(&self, t: Instant) -> u64 {
        let start = self.sink.as_ref().map_or(t, |s| s.start);
        t.saturating_duration_since(start).as_micros() as u64
    }

    /// A span `from..to` named `name` on track `tid`, with `args` (`Value::Null` for none).
    pub fn span(
        &mut self,
        tid: u32,
        cat: &'static str,
        name: impl Into<String>,
        from: Instant,
        to: Instant,
        args: Value,
    ) {
        if !self.active {
            return;
        }
        // Both ends are truncated to whole microseconds, so a span inside another stays inside.
        let (ts_us, end) = (self.us(from), self.us(to));
        self.events.push(Event {
            name: name.into(),
            cat,
            ph: 'X',
            tid,
            ts_us,
            dur_us: end.saturating_sub(ts_us),
            flow_id: 0,
            args,
        });
    }

    /// A span that starts at `from` and lasts `dur`.
    pub fn span_for(
        &mut self,
        tid: u32,
        cat: &'static str,
        name: impl Into<String>,
        from: Instant,
        dur: Duration,
        args: Value,
    ) {
        self.span(tid, cat, name, from, from + dur, args);
    }

    /// One end of a flow arrow `id` at `at` on track `tid`: `start` true for the tail.
    pub fn flow(&mut self, tid: u32, id: u64, at: Instant, start: bool) {
        if !self.active {
            return;
        }
        let ts_us = self.us(at);
        self.events.push(Event {
            name: "bucket".into(),
            cat: "flow",
            ph: if start { 's' } else { 'f' },
            tid,
            ts_us,
            dur_us: 0,
            flow_id: id,
            args: Value::Null,
        });
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if let Some(sink) = &self.sink {
            lock(&sink.events).append(&mut self.events);
        }
    }
}

/// CPU time the calling thread has used so far (Linux's `CLOCK_THREAD_CPUTIME_ID`; zero where
/// it cannot be read): what a communication thread spent working, as opposed to waiting.
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through the pointer, which is valid.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0;
    if !ok {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_windows_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_steps("5..8"), Ok(5..8));
        assert_eq!(parse_steps(" 0 .. 1"), Ok(0..1));
        for bad in ["5", "8..5", "3..3", "a..b", "-1..2"] {
            assert!(parse_steps(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_steps_in_the_window_are_kept_and_off_keeps_nothing() {
        let t0 = Instant::now();
        let sink = TraceSink::new(t0, 2..3);
        let mut off = Tracer::off();
        off.begin_step(2);
        assert!(!off.active());
        let mut t = sink.tracer(&[(0, "worker 0".into())]);
        for step in 0..5 {
            t.begin_step(step);
            t.span(
                0,
                "step",
                "step",
                t0,
                t0 + Duration::from_millis(1),
                Value::Null,
            );
        }
        drop(t);
        assert_eq!(sink.len(), 1);
        let v: Value = serde_json::from_str(&sink.to_json()).unwrap();
        let names: Vec<_> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect();
        assert!(names.contains(&"thread_name".to_string()));
        assert_eq!(names.iter().filter(|n| *n == "step").count(), 1);
    }
}
