//! The data-parallel engine (the paper's first two ideas): gradient buckets whose
//! communication overlaps backward, combined by a per-bucket communication mode.
//!
//! One step on each worker:
//! 1. forward on the worker's shard of the global batch;
//! 2. backward in reverse topological order; each layer writes its parameter gradients
//!    straight into its slot of a bucket buffer (the [`Reducer`] is the backward's gradient
//!    sink), and once a layer completes a bucket, the [`Reducer`] hands the bucket to the
//!    worker's communication thread, which all-reduces it while backward continues;
//! 3. [`Reducer::finish`] waits for the remaining buckets (the exposed communication);
//! 4. the update: every worker applies the same update to the same summed gradient
//!    (all-reduce modes) or worker 0 updates and broadcasts the weights (tree mode, Caffe's
//!    scheme).
//!
//! With `--schedule priority` ([`schedule`]) steps 3 and 4 move into the next step's forward:
//! buckets are reduced input-first in an order fixed on every rank, and each layer's bucket is
//! waited for and applied just before that layer's forward.
//!
//! The bucket plan's layout is in [`bucket`] (its caps come from the planning rules,
//! [`crate::plan`]); the algorithms are in [`crate::comm`].

pub mod bucket;
mod reducer;
pub mod schedule;

pub use bucket::{Bucket, BucketPlan, Slot};
pub use reducer::{BucketOp, BucketSpan, CommTimes, Reducer};
pub use schedule::{ReduceOrder, Schedule};

/// The text of a panic payload, for the error that reports the panic.
///
/// `panic!("...")` carries a `&str` or a `String`; `std::panic::panic_any` may carry an error
/// value. A caller that passes `&payload` where `payload` is the `Box<dyn Any + Send>` from
/// `catch_unwind` hands over the box itself (the reference coerces to `&dyn Any` of the
/// `Box`), which made the communication thread's panics read "unknown panic": the box is
/// looked into here, so both ways of passing it give the message.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        return (*s).to_string();
    }
    if let Some(s) = payload.downcast_ref::<String>() {
        return s.clone();
    }
    if let Some(inner) = payload.downcast_ref::<Box<dyn std::any::Any + Send>>() {
        return panic_message(inner.as_ref());
    }
    if let Some(e) = payload.downcast_ref::<Box<dyn std::error::Error + Send + Sync>>() {
        return e.to_string();
    }
    if let Some(e) = payload.downcast_ref::<Box<dyn std::error::Error + Send>>() {
        return e.to_string();
    }
    "a panic whose payload is neither a string nor an error (no message to show)".into()
}

/// Lowers the calling (compute) thread's scheduling priority a little (nice +5), so that a
/// communication thread woken to reduce a bucket gets a core sooner.
///
/// Overlap needs the communication thread to start a bucket's reduction while backward goes
/// on. When the compute threads keep every core busy (CPU training: workers x threads = cores),
/// the scheduler let the woken communication thread wait for a compute thread's time slice: in
/// a traced lenet5 step (2 workers x 1 thread, 2 cores) the first bucket, handed over 0.08 ms
/// into backward, started 1.6 ms later. The reducer yields the core after each hand-off (see
/// `Reducer::on_block`); this makes the scheduler favour the communication thread besides
/// (lenet5, 1 Gbit/s, redundant: exposed comm 0.6-0.8 ms with the yield alone, 0.4 ms with
/// both, 1.7-1.8 ms with neither). Niceness only matters under contention. Linux only.
///
/// Under `--schedule priority` (nice +12) the communication thread wakes during the forward
/// too, for every partition (its decision, then each message of the collective), and each
/// late wake-up holds up the next layer's weights. Measured 2026-12-04, 2 workers x 1 thread
/// on 2 cores, 50 us, medians of steps over 2 interleaved rounds, nice 5 against 12: priority
/// resnet20 at 100 Mbit/s redundant 104.9 -> 98.2 ms, ring 94.6 -> 93.7; vgg-small at
/// 200 Mbit/s ring 31.4 -> 29.8, redundant 34.0 -> 32.6; overlap's rows and the rows without
/// a link within 1% either way, so overlap keeps +5.
///
/// Nice 12 was not enough either: a woken communication thread still waited, at times, for
/// the compute thread's scheduler tick (4 ms here). Traced 2026-12-05 (vgg-small, 2 workers x
/// 1 thread on 2 cores, 150 Mbit/s, ring): the held-back partition of 148 KB that crosses
/// during the next forward took 11-12 ms on both ranks instead of 8 in about half the runs,
/// and those runs' steps were 39.4-42.5 ms against 37.6-37.9. So under priority the compute
/// threads take the idle scheduling policy (`SCHED_IDLE`), which any thread may set for
/// itself: the kernel preempts an idle-policy thread whenever a normal one wakes on its core
/// (`check_preempt_wakeup_fair`, kernel/sched/fair.c), and then the communication thread never
/// waits for compute. Where the policy is refused the threads take nice 12 as before. The cost:
/// any other normal thread on the machine (another program, the data loaders) also runs
/// before priority's compute.
///
/// Only where the collectives wait on a link ([`CollectivesWait::OnALink`]), where the traces
/// above were taken: in process without an emulated link the communication thread's work is
/// summing and copying at memory speed, and there the idle policy measured slower. Measured
/// 2026-12-05 (`train --dataset synthetic:3x32x32:10 --workers 2 --threads 1 --batch 64`, no
/// link, 11,520-image epochs for vgg-small and 5,760 for resnet20, images/s against overlap's
/// in the same interleaved rounds, medians of 3-5 rounds; one row's sets can differ by 7%:
/// resnet20 ring under the idle policy read 0.959x, 0.959x and 1.032x): on the 7 row sets
/// measured both ways the idle policy averaged 0.987x and nice 5 1.009x; nice 12 and nice 5,
/// on the 4 measured both ways, 1.003x and 1.004x. So priority without a link takes
/// overlap's own nice 5 (docs/bench/schedule.md, "Without a link, priority's compute shares
/// the cores as overlap's does").
pub fn yield_cpu_to_communication(schedule: Schedule, collectives: CollectivesWait) {
    match (schedule, collectives) {
        (Schedule::Overlap, _) | (Schedule::Priority, CollectivesWait::OnMemory) => set_niceness(5),
        (Schedule::Priority, CollectivesWait::OnALink) => {
            if !set_idle_policy() {
                set_niceness(12);
            }
        }
    }
}

/// What a run's collectives mostly wait on, for [`yield_cpu_to_communication`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectivesWait {
    /// A link: the network between processes, or the link a run in one process emulates
    /// (`--link-bandwidth`).
    OnALink,
    /// Nothing but memory: the workers are threads of one process and no link is emulated.
    OnMemory,
}

/// Puts the calling thread under the idle scheduling policy (Linux); false where it was
/// refused or elsewhere.
fn set_idle_policy() -> bool {
    #[cfg(target_os = "linux")]
    // SAFETY: sched_setscheduler on this thread (pid 0 means the caller) reads the parameter
    // struct, which lives on this stack for the call.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) == 0
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// Sets the calling thread's niceness (Linux; elsewhere a no-op). For
/// [`yield_cpu_to_communication`], and for an emulated device's compute (nice 19: see
/// `testbed::device`).
pub fn set_niceness(nice: i32) {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on this thread's id (who = 0 means the caller) takes no pointers.
    unsafe {
        let _ = libc::setpriority(libc::PRIO_PROCESS, 0, nice);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}

#[cfg(test)]
mod tests {
    use super::panic_message;

    /// The calling thread's (scheduling policy, niceness).
    #[cfg(target_os = "linux")]
    fn policy_and_niceness() -> (i32, i32) {
        // SAFETY: both calls concern the calling thread (0) and take no pointers.
        unsafe {
            let policy = libc::sched_getscheduler(0);
            let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
            (policy, nice)
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn priority_gives_the_core_away_only_where_the_collectives_wait_on_a_link() {
        use super::Schedule;
        use super::{yield_cpu_to_communication, CollectivesWait};
        // Each on a fresh thread: a thread keeps what it set, and threads start from their
        // creator's settings. Returns (policy, niceness) before and after.
        let policy_after = |schedule, collectives| {
            std::thread::spawn(move || {
                let before = policy_and_niceness();
                yield_cpu_to_communication(schedule, collectives);
                (before, policy_and_niceness())
            })
            .join()
            .expect("the thread sets its priority")
        };
        // Nice 5 under the normal policy; where the tests run at a niceness above 5 without
        // the privilege to lower it, the niceness they run at.
        let shares_at_nice_5 = |((_, nice_before), (policy, nice)): ((i32, i32), (i32, i32))| {
            policy != libc::SCHED_IDLE && (nice == 5 || (nice_before > 5 && nice == nice_before))
        };
        assert!(shares_at_nice_5(policy_after(
            Schedule::Priority,
            CollectivesWait::OnMemory
        )));
        assert!(shares_at_nice_5(policy_after(
            Schedule::Overlap,
            CollectivesWait::OnMemory
        )));
        assert!(shares_at_nice_5(policy_after(
            Schedule::Overlap,
            CollectivesWait::OnALink
        )));
        // The idle policy, or nice 12 where the kernel refuses it.
        let (_, (policy, nice)) = policy_after(Schedule::Priority, CollectivesWait::OnALink);
        assert!(
            policy == libc::SCHED_IDLE || nice == 12,
            "priority over a link: policy {policy} nice {nice}"
        );
    }

    #[test]
    fn panic_payloads_keep_their_message_however_they_are_passed() {
        let caught = |f: fn()| std::panic::catch_unwind(f).unwrap_err();
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let literal = caught(|| panic!("plain"));
        let formatted = caught(|| panic!("formatted {}", 7));
        let error = caught(|| {
            std::panic::panic_any(Box::<dyn std::error::Error + Send + Sync>::from("an error"))
        });
        std::panic::set_hook(hook);
        assert_eq!(panic_message(&*literal), "plain");
        assert_eq!(panic_message(&*formatted), "formatted 7");
        assert_eq!(panic_message(&*error), "an error");
        // Passed as the box itself, as the communication thread did.
        assert_eq!(panic_message(&literal), "plain");
        assert_eq!(panic_message(&formatted), "formatted 7");
    }
}
