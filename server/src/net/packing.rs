//! Which shard thread serves which connection, as the load changes.
//!
//! A connection is served by one shard's thread, and every shard thread
//! that has a connection with work wakes for it. At a light load those
//! wake-ups are most of the cost: eight paced clients spread over two
//! threads wake both for each burst of requests, where one thread would
//! take the burst in one wake-up (CPU per request 1.12× redis-server's
//! with two threads, 1.05× with one). So while the shard threads together
//! use less than `pack-below` percent of one core, for [`PACK_AFTER_NS`],
//! every connection that can move is served by one
//! shard (the home: the one serving the most); as soon as they use more
//! than [`SPREAD_MARGIN`] points above that in one tick, connections are
//! spread out again, evened out by count. A shard still owns its keys: a
//! connection on the home reads the other shards' stores as it always
//! does (their locks are free while they idle).
//!
//! The ticker decides ([`Packer::tick`]) from the shard threads' CPU time,
//! which each shard's cron publishes; a connection moves itself between
//! two requests ([`move_target`]), when nothing of it is half done.

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;

use crate::shared::{Placement, Shared};

/// How long the load stays light before connections are packed (ns).
pub const PACK_AFTER_NS: u64 = 2_000_000_000;
/// Percentage points of one core above `pack-below` that spread the
/// connections again, in one tick: the gap keeps a packed server, whose
/// load falls by the wake-ups it saves, from going back and forth.
pub const SPREAD_MARGIN: u64 = 30;
/// A new connection stays on the shard it was accepted on for this long
/// (ns) before it may be packed: long enough for the ticker to see the
/// load it brings, so fifty clients arriving at once are not first piled
/// on one thread and then spread.
pub const SETTLE_NS: u64 = 300_000_000;

/// The ticker's side: the shard threads' CPU time at the last tick, and
/// since when every tick was light.
#[derive(Debug, Default)]
pub struct Packer {
    last_cpu_ns: u64,
    last_ns: u64,
    /// The start of the current run of light ticks (0: none).
    light_since: u64,
}

impl Packer {
    /// One tick at `now` (mono ns): the shard threads have used `cpu_ns`
    /// in all (their published sum), the shards serve `seated` connections
    /// each, and the threshold is `pack_below` percent of a core (0:
    /// never pack). Returns where connections are to be served now.
    pub fn tick(
        &mut self,
        now: u64,
        cpu_ns: u64,
        seated: &[usize],
        pack_below: u64,
        current: Placement,
    ) -> Placement {
        let (wall, used) = (
            now.saturating_sub(self.last_ns),
            cpu_ns.saturating_sub(self.last_cpu_ns),
        );
        let (first, since) = (self.last_ns == 0, self.last_ns);
        self.last_ns = now;
        self.last_cpu_ns = cpu_ns;
        if first || wall == 0 {
            return current;
        }
        // Percent of one core, over this tick.
        let load = used.saturating_mul(100) / wall;
        let balanced = seated.iter().max().copied().unwrap_or(0)
            <= seated.iter().min().copied().unwrap_or(0) + 1;
        if let Placement::On(_) = current {
            if pack_below == 0 || load > pack_below + SPREAD_MARGIN {
                self.light_since = 0;
                return if balanced {
                    Placement::Stay
                } else {
                    Placement::Spread
                };
            }
            return current;
        }
        if load >= pack_below || seated.len() < 2 {
            self.light_since = 0;
        } else if self.light_since == 0 {
            self.light_since = since;
        }
        if self.light_since != 0 && now - self.light_since >= PACK_AFTER_NS {
            // Home: the shard serving the most (the fewest move).
            let home = (0..seated.len())
                .max_by_key(|&s| (seated[s], std::cmp::Reverse(s)))
                .unwrap_or(0);
            return Placement::On(home);
        }
        match current {
            Placement::Spread if balanced => Placement::Stay,
            other => other,
        }
    }
}

/// Where a connection served by shard `here` should go now (checked
/// between requests): `None` to stay. Under [`Placement::Spread`] the move is counted
/// here at once (the seats are taken over by [`crate::shared::ShardSeat::move_to`]
/// on the way), so connections deciding together do not all leave.
#[inline]
pub fn move_target(shared: &Shared, here: usize) -> Option<usize> {
    match shared.placement() {
        Placement::Stay => None,
        Placement::Spread => spread_target(&shared.seated, here),
        Placement::On(home) => (home != here && home < shared.shards).then_some(home),
    }
}

/// The least-served shard when `here` serves at least two more.
fn spread_target(seated: &[AtomicUsize], here: usize) -> Option<usize> {
    let mine = seated[here].load(Relaxed);
    let (fewest, target) = seated
        .iter()
        .enumerate()
        .map(|(s, n)| (n.load(Relaxed), s))
        .min()?;
    (mine > fewest + 1 && target != here).then_some(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: u64 = 100_000_000;
    /// Ticks in [`PACK_AFTER_NS`].
    const TICKS: u32 = (PACK_AFTER_NS / TICK) as u32;

    /// Runs `ticks` ticks at `load` percent of a core.
    fn run(
        p: &mut Packer,
        t: &mut (u64, u64),
        ticks: u32,
        load: u64,
        seated: &[usize],
        mut mode: Placement,
    ) -> Placement {
        for _ in 0..ticks {
            t.0 += TICK;
            t.1 += TICK * load / 100;
            mode = p.tick(t.0, t.1, seated, 40, mode);
        }
        mode
    }

    #[test]
    fn light_load_packs_after_a_while_on_the_busiest_shard() {
        let (mut p, mut t) = (Packer::default(), (1, 0));
        let mode = run(&mut p, &mut t, TICKS, 20, &[3, 5], Placement::Stay);
        assert_eq!(mode, Placement::Stay, "one tick short");
        assert_eq!(run(&mut p, &mut t, 1, 20, &[3, 5], mode), Placement::On(1));
        // A tick of load between the two thresholds keeps it packed.
        assert_eq!(
            run(&mut p, &mut t, 5, 60, &[0, 8], Placement::On(1)),
            Placement::On(1)
        );
    }

    #[test]
    fn a_busy_tick_breaks_the_light_run_and_spreads_a_packed_server() {
        let (mut p, mut t) = (Packer::default(), (1, 0));
        let mode = run(&mut p, &mut t, TICKS - 1, 10, &[4, 4], Placement::Stay);
        let mode = run(&mut p, &mut t, 1, 50, &[4, 4], mode);
        assert_eq!(
            run(&mut p, &mut t, TICKS - 1, 10, &[4, 4], mode),
            Placement::Stay
        );
        let mode = run(&mut p, &mut t, 2, 10, &[4, 4], mode);
        assert_eq!(mode, Placement::On(0));
        let mode = run(&mut p, &mut t, 1, 75, &[8, 0], mode);
        assert_eq!(mode, Placement::Spread);
        // Spread until the counts are even, then stay.
        assert_eq!(run(&mut p, &mut t, 1, 75, &[6, 2], mode), Placement::Spread);
        assert_eq!(
            run(&mut p, &mut t, 1, 75, &[4, 4], Placement::Spread),
            Placement::Stay
        );
    }

    #[test]
    fn one_shard_or_zero_threshold_never_packs() {
        let (mut p, mut t) = (Packer::default(), (1, 0));
        assert_eq!(
            run(&mut p, &mut t, 100, 0, &[5], Placement::Stay),
            Placement::Stay
        );
        let mut mode = Placement::Stay;
        for _ in 0..100 {
            t.0 += TICK;
            mode = p.tick(t.0, t.1, &[2, 2], 0, mode);
        }
        assert_eq!(mode, Placement::Stay);
        // Turned off while packed: spread again.
        t.0 += TICK;
        assert_eq!(
            p.tick(t.0, t.1, &[4, 0], 0, Placement::On(0)),
            Placement::Spread
        );
    }

    #[test]
    fn spread_moves_only_from_a_shard_two_ahead() {
        let seated = |v: &[usize]| v.iter().map(|&n| AtomicUsize::new(n)).collect::<Vec<_>>();
        assert_eq!(spread_target(&seated(&[5, 3]), 0), Some(1));
        assert_eq!(spread_target(&seated(&[4, 3]), 0), None);
        assert_eq!(spread_target(&seated(&[3, 5]), 0), None);
        assert_eq!(spread_target(&seated(&[6, 4, 2]), 0), Some(2));
        assert_eq!(spread_target(&seated(&[6, 4, 2]), 1), Some(2));
    }
}
