//! When a connection polls for its client's next request before its shard
//! may sleep (`--idle-poll-us` is the longest it polls).
//!
//! Polling pays only when it brings the next request sooner: a client that
//! sends its next request as soon as it has the reply (a lookup loop, a
//! benchmark) waits for the server's wake-up on every round trip, and
//! polling removes it. A paced client (a scheduler that looks up when a
//! request arrives) sends on its own clock: polling catches nothing sooner
//! and only burns CPU. So each connection measures it: the mean time
//! between its requests while not polling, then over a trial of polling.
//! Polling stays on only if the trial's mean is under [`GAIN`] of the rest's
//! (measured again every [`KEEP`] requests, or after more than [`MISSES`]
//! polls that caught nothing); a trial that misses (the window passes
//! without a request) or gains too little ends at once and the next one
//! waits twice as long (up to [`MAX_REST`] requests). A paced client so
//! costs one trial's polling per thousands of requests.

/// Requests measured in a trial (and at the end of a rest).
const MEASURE: u32 = 32;
/// The longest rest between trials, in requests.
const MAX_REST: u32 = 16384;
/// Requests of polling before it is measured again.
const KEEP: u32 = 8192;
/// Polls that may miss (the window passes) in a stretch of polling before
/// the client is measured again: a client that pauses now and then keeps
/// its polling, one that turned paced stops within this many polls.
const MISSES: u32 = 32;
/// Polling is kept when it makes the mean time between requests at most
/// this fraction of what it is without (numerator, denominator).
const GAIN: (u64, u64) = (3, 4);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Not polling for `left` more requests; the last [`MEASURE`] of them
    /// are timed.
    Rest { left: u32 },
    /// Polling, timed, for `left` more requests.
    Trial { left: u32 },
    /// Polling (it paid off) for `left` more requests; `misses` so far.
    Poll { left: u32, misses: u32 },
}

/// One connection's polling plan.
#[derive(Debug)]
pub struct PollPlan {
    phase: Phase,
    /// The previous batch's start (mono ns; 0: none yet).
    last: u64,
    /// Nanoseconds between batches summed over the current measurement
    /// (always [`MEASURE`] gaps when it ends).
    sum: u64,
    /// [`PollPlan::sum`] at the end of the last rest (a trial's sum covers
    /// as many gaps, so the two compare as means would).
    rest_sum: u64,
    /// How long the next rest lasts.
    rest: u32,
}

impl Default for PollPlan {
    fn default() -> PollPlan {
        PollPlan {
            phase: Phase::Rest { left: MEASURE },
            last: 0,
            sum: 0,
            rest_sum: 0,
            rest: MEASURE,
        }
    }
}

impl PollPlan {
    /// Whether to poll now, after this batch's replies.
    #[inline]
    pub fn wants_poll(&self) -> bool {
        !matches!(self.phase, Phase::Rest { .. })
    }

    /// A batch of requests began at `now` (mono ns).
    #[inline]
    pub fn arrived(&mut self, now: u64) {
        let (first, gap) = (self.last == 0, now.saturating_sub(self.last));
        self.last = now;
        if first {
            return;
        }
        // A phase starts with `left` >= 1 and ends at 0.
        match &mut self.phase {
            Phase::Rest { left } => {
                *left -= 1;
                if *left < MEASURE {
                    self.sum += gap;
                }
                if *left == 0 {
                    self.rest_sum = self.sum;
                    self.start(Phase::Trial { left: MEASURE });
                }
            }
            Phase::Trial { left } => {
                *left -= 1;
                self.sum += gap;
                if *left == 0 {
                    if self.sum * GAIN.1 <= self.rest_sum * GAIN.0 {
                        self.rest = MEASURE;
                        self.start(Phase::Poll {
                            left: KEEP,
                            misses: 0,
                        });
                    } else {
                        self.back_off();
                    }
                }
            }
            Phase::Poll { left, .. } => {
                *left -= 1;
                if *left == 0 {
                    // Measured again: a client that became paced stops
                    // costing polls.
                    self.start(Phase::Rest { left: MEASURE });
                }
            }
        }
    }

    /// A poll ended: `caught` when the request came within the window.
    #[inline]
    pub fn polled(&mut self, caught: bool) {
        if caught {
            return;
        }
        match &mut self.phase {
            Phase::Trial { .. } => self.back_off(),
            Phase::Poll { misses, .. } => {
                *misses += 1;
                if *misses > MISSES {
                    // The client turned paced (or idle): measure again.
                    self.start(Phase::Rest { left: self.rest });
                }
            }
            Phase::Rest { .. } => {}
        }
    }

    /// A trial that did not pay: rest twice as long as last time.
    fn back_off(&mut self) {
        self.rest = (self.rest * 2).min(MAX_REST);
        self.start(Phase::Rest { left: self.rest });
    }

    fn start(&mut self, phase: Phase) {
        self.phase = phase;
        self.sum = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `n` batches `gap_ns` apart; `poll_gap_ns` instead while the
    /// plan polls (a client that polling brings sooner), with polls caught
    /// unless `misses`. Returns how many of the batches were polled after.
    fn drive(
        p: &mut PollPlan,
        now: &mut u64,
        n: u32,
        gap: u64,
        poll_gap: u64,
        misses: bool,
    ) -> u32 {
        let mut polled = 0;
        for _ in 0..n {
            let polling = p.wants_poll();
            *now += if polling { poll_gap } else { gap };
            p.arrived(*now);
            if p.wants_poll() {
                polled += 1;
                p.polled(!misses);
            }
        }
        polled
    }

    #[test]
    fn a_client_polling_brings_sooner_is_polled() {
        let (mut p, mut now) = (PollPlan::default(), 1);
        // 17 µs between requests when the server sleeps, 7.5 µs when it polls.
        let polled = drive(&mut p, &mut now, 100_000, 17_000, 7_500, false);
        assert!(polled > 99_000, "{polled}");
    }

    #[test]
    fn a_fast_client_that_pauses_now_and_then_stays_polled() {
        let (mut p, mut now) = (PollPlan::default(), 1);
        drive(&mut p, &mut now, 1_000, 17_000, 7_500, false);
        let mut polled = 0;
        for i in 0..100_000u32 {
            now += if p.wants_poll() { 7_500 } else { 17_000 };
            p.arrived(now);
            if p.wants_poll() {
                polled += 1;
                // One poll in 500 misses (the client was descheduled).
                p.polled(i % 500 != 0);
            }
        }
        assert!(polled > 98_000, "{polled}");
    }

    #[test]
    fn a_paced_client_is_almost_never_polled() {
        // The same gap either way (the client's own clock), caught or not.
        for misses in [false, true] {
            let (mut p, mut now) = (PollPlan::default(), 1);
            let polled = drive(&mut p, &mut now, 100_000, 50_000, 50_000, misses);
            assert!(polled < 1_000, "misses {misses}: {polled} of 100000 polled");
        }
    }

    #[test]
    fn a_client_that_turns_paced_stops_being_polled_and_back() {
        let (mut p, mut now) = (PollPlan::default(), 1);
        drive(&mut p, &mut now, 20_000, 17_000, 7_500, false);
        assert!(p.wants_poll());
        let polled = drive(&mut p, &mut now, 100_000, 200_000, 200_000, true);
        assert!(polled < 1_000, "{polled}");
        drive(&mut p, &mut now, 40_000, 17_000, 7_500, false);
        assert!(p.wants_poll());
    }
}
