//! Timers for runtimes without tokio's time driver.
//!
//! A shard runtime parks whenever it has nothing to do, which with one
//! waiting client is once per request, and tokio's time driver walks its
//! timer wheel, takes its lock and reads the clock at every park, whether
//! any timer is set or not: about 7% of a GET's instructions (callgrind,
//! one client; docs/decisions/0013-shard-runtimes-without-time-driver.md).
//! So the shard runtimes run without a time driver, and their few timers
//! (a blocked MGETPREFIX's timeout, a client slow to take its replies,
//! connect and hand-off timeouts) are served by one thread, `kvtier-timer`,
//! whose runtime has one. A [`Sleep`] is a task spawned there and awaited
//! through its join handle, which any runtime can await; dropping it aborts
//! the task.
//!
//! A sleep therefore costs a task and a wake-up of another thread: nothing
//! on a request's common path may use one (idle clients are found by the
//! shard's cron instead of a timer per read). [`timeout`] sets no timer at
//! all when its future is ready at the first poll.
//!
//! The API follows `tokio::time`: [`sleep`], [`sleep_until`], [`timeout`],
//! [`timeout_at`], with `std::time::Instant` deadlines.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// The timer thread's runtime, once started.
static TIMER: OnceLock<Handle> = OnceLock::new();
/// Held while the timer thread starts (two first users start one thread).
static STARTING: Mutex<()> = Mutex::new(());

/// Starts the timer thread unless it runs already. A server calls it at
/// start, so that an operating system refusing the thread stops the start
/// rather than the first timer.
pub fn start() -> io::Result<()> {
    runtime().map(|_| ())
}

fn runtime() -> io::Result<&'static Handle> {
    if let Some(handle) = TIMER.get() {
        return Ok(handle);
    }
    let _starting = STARTING.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(handle) = TIMER.get() {
        return Ok(handle);
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("kvtier-timer".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let _ = tx.send(Ok(runtime.handle().clone()));
            runtime.block_on(std::future::pending::<()>());
        })?;
    let handle = rx
        .recv()
        .map_err(|_| io::Error::other("the timer thread ended at start"))??;
    Ok(TIMER.get_or_init(|| handle))
}

/// A future that completes at a deadline (see the crate docs for its cost).
#[must_use = "a Sleep does nothing unless awaited"]
pub struct Sleep {
    /// The timer thread's task; `None` when the deadline had passed already.
    task: Option<JoinHandle<()>>,
}

/// Completes once `duration` has passed.
pub fn sleep(duration: Duration) -> Sleep {
    sleep_until(deadline_after(duration))
}

/// Completes at `deadline` (at once if it has passed).
pub fn sleep_until(deadline: Instant) -> Sleep {
    if deadline <= Instant::now() {
        return Sleep { task: None };
    }
    let handle = runtime().expect("the kvtier-timer thread could not start");
    Sleep {
        // Made inside the task: a tokio sleep binds to the time driver of
        // the runtime it is created on.
        task: Some(handle.spawn(async move { tokio::time::sleep_until(deadline.into()).await })),
    }
}

/// `duration` from now; a duration too long for the clock is about 30
/// years (a timer that never fires, in effect).
pub fn deadline_after(duration: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(30 * 365 * 86_400);
    let now = Instant::now();
    now.checked_add(duration)
        .unwrap_or_else(|| now + FAR.min(duration))
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.task {
            None => Poll::Ready(()),
            // An error (the task cancelled with its runtime) ends the
            // sleep too: a timer must never hang its waiter.
            Some(task) => Pin::new(task).poll(cx).map(|_| ()),
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// What [`timeout`] returns when the deadline came first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("deadline has elapsed")
    }
}

impl std::error::Error for Elapsed {}

impl From<Elapsed> for io::Error {
    fn from(_: Elapsed) -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, Elapsed)
    }
}

/// Runs `future` for at most `duration`.
pub async fn timeout<F: Future>(duration: Duration, future: F) -> Result<F::Output, Elapsed> {
    timeout_at(deadline_after(duration), future).await
}

/// Runs `future` until `deadline` at most. The future is polled first, and
/// the timer is set only when it is not ready at once.
pub async fn timeout_at<F: Future>(deadline: Instant, future: F) -> Result<F::Output, Elapsed> {
    let mut future = std::pin::pin!(future);
    let mut timer: Option<Sleep> = None;
    poll_fn(|cx| {
        if let Poll::Ready(out) = future.as_mut().poll(cx) {
            return Poll::Ready(Ok(out));
        }
        let timer = timer.get_or_insert_with(|| sleep_until(deadline));
        Pin::new(timer).poll(cx).map(|()| Err(Elapsed))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::sync::Notify;

    /// A runtime like a shard's: no time driver.
    fn shard_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[test]
    fn sleeps_on_a_runtime_without_a_time_driver() {
        let started = Instant::now();
        shard_runtime().block_on(sleep(Duration::from_millis(30)));
        assert!(started.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn a_passed_deadline_is_ready_at_once() {
        let past = Instant::now();
        let mut sleep = sleep_until(past);
        assert!(sleep.task.is_none());
        shard_runtime().block_on(&mut sleep);
    }

    #[test]
    fn timeout_elapses_or_returns_the_value() {
        let rt = shard_runtime();
        let never = Arc::new(Notify::new());
        let r = rt.block_on(timeout(Duration::from_millis(20), never.notified()));
        assert_eq!(r, Err(Elapsed));
        let r = rt.block_on(timeout(Duration::from_secs(60), async { 7 }));
        assert_eq!(r, Ok(7));
        // Woken before the deadline: the value, long before 60 s.
        let started = Instant::now();
        let n = Arc::clone(&never);
        let r = rt.block_on(async move {
            let waiter = timeout(Duration::from_secs(60), n.notified());
            tokio::join!(waiter, async { never.notify_waiters() }).0
        });
        assert_eq!(r, Ok(()));
        assert!(started.elapsed() < Duration::from_secs(30));
    }

    #[test]
    fn a_dropped_sleep_cancels_its_task() {
        let rt = shard_runtime();
        let task = {
            let sleep = sleep(Duration::from_secs(3600));
            let task = sleep.task.as_ref().unwrap().abort_handle();
            drop(sleep);
            task
        };
        rt.block_on(async {
            for _ in 0..1000 {
                if task.is_finished() {
                    return;
                }
                tokio::task::yield_now().await;
                std::thread::sleep(Duration::from_millis(1));
            }
            panic!("the aborted timer task is still there");
        });
    }

    #[test]
    fn huge_durations_do_not_overflow() {
        let far = deadline_after(Duration::MAX);
        assert!(far > Instant::now() + Duration::from_secs(86_400 * 365));
    }
}
