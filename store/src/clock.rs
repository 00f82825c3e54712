//! The clock every expiry, TTL, idle time and latency reads: the monotonic
//! clock plus an offset to the wall clock, read without a system call.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch: every expiry, TTL and idle time.
///
/// One clock for every thread: the monotonic clock plus an offset to the
/// wall clock ([`resync_clock`] re-reads it once a second). A caller that
/// already read the monotonic clock ([`mono_ns`]) converts that reading
/// ([`ms_at`]) instead of reading a second clock; a later reading never
/// gives an earlier time, except across a resync that follows a step of
/// the system clock.
pub fn now_ms() -> u64 {
    ms_at(mono_ns())
}

/// The monotonic clock (`CLOCK_MONOTONIC`, the clock `Instant` reads), in
/// nanoseconds since an arbitrary start. Connections read it twice per
/// batch of commands (the batch's time, and how long its commands took):
/// read directly and kept as a plain integer, a reading and a difference
/// cost a third of the instructions of `Instant::now()` and its checked
/// subtraction (callgrind, per GET).
pub fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The CPU time the calling thread has used, in nanoseconds
/// (`CLOCK_THREAD_CPUTIME_ID`: a system call, unlike [`mono_ns`]).
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

#[inline(always)]
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a pointer to a
    // local that outlives the call; both clocks used exist on every Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// [`now_ms`] at the [`mono_ns`] reading `at`.
pub fn ms_at(at: u64) -> u64 {
    let offset = wall_offset_us().load(std::sync::atomic::Ordering::Relaxed);
    ((at / 1000) as i64 + offset).max(0) as u64 / 1000
}

/// Re-reads the wall clock for [`now_ms`] (NTP slews it against the
/// monotonic clock by up to 0.05%).
pub fn resync_clock() {
    wall_offset_us().store(wall_offset(), std::sync::atomic::Ordering::Relaxed);
}

/// Microseconds from the monotonic clock's start to the Unix epoch.
fn wall_offset_us() -> &'static std::sync::atomic::AtomicI64 {
    static OFFSET: std::sync::OnceLock<std::sync::atomic::AtomicI64> = std::sync::OnceLock::new();
    OFFSET.get_or_init(|| std::sync::atomic::AtomicI64::new(wall_offset()))
}

fn wall_offset() -> i64 {
    let mono = mono_ns();
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0);
    wall - (mono / 1000) as i64
}
