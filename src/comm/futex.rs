//! Sleeping until a 32-bit word changes, without a lock: the wait of the shared-memory
//! collective's barrier ([`crate::comm::shared_memory`]).
//!
//! Why not a `Mutex` + `Condvar`: the last worker to arrive at a barrier would take the mutex
//! to notify, and every waiter it wakes takes the same mutex again on its way out of the wait,
//! one after another. With more workers than cores that queue is a context switch each, and at
//! 4 and 8 workers on 2 cores it cost a small all-reduce more than the tree's messages. On
//! Linux a futex sleeps on the word itself: the kernel checks it still holds the value the
//! waiter saw (so a wake-up between the check and the sleep is never lost) and wakes all
//! waiters at once, with no lock for them to queue on. Elsewhere the wait is a short sleep.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `word` holds `expected`, for at most `timeout`; may return early (a wake-up,
/// a signal, or the word already changed). The caller rechecks its condition.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    #[cfg(target_os = "linux")]
    {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: FUTEX_WAIT reads the aligned 32-bit word `word` points to (it lives as
        // long as this borrow) and the timespec on this stack; it writes neither.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                expected,
                &ts as *const libc::timespec,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        if word.load(std::sync::atomic::Ordering::SeqCst) == expected {
            std::thread::sleep(timeout.min(Duration::from_micros(50)));
        }
    }
}

/// Wakes every thread sleeping in [`wait`] on `word`.
pub fn wake_all(word: &AtomicU32) {
    #[cfg(target_os = "linux")]
    // SAFETY: FUTEX_WAKE only uses the word's address as a key; it reads no memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
    #[cfg(not(target_os = "linux"))]
    let _ = word;
}
