//! Demand: the high-water mark of the engine's bytes over a sliding window
//! (after tcmalloc's `MinMaxTracker`, which sizes its `huge_cache`): live
//! bytes as they grow, and at a miss the live bytes with the new block
//! plus the slack, the retained bytes freed within the window that did not
//! fit it. Those runs serve the blocks after it: a request whose blocks
//! come and go in an order whose footprint exceeds its peak of live bytes
//! then repeats without a miss. Runs retained longer than the window are no
//! slack, so misses that recur keep no run longer than a window after the
//! last miss that found it recent (two windows and a slot after its free),
//! outside a hold. Retention keeps what
//! the window's demand can take back (its peak less the live bytes now)
//! and gives the rest back, oldest first ([`retain::decay`]): an idle spell
//! shorter than the window costs the next request no page fault, and a
//! transient peak is given back one window after it.
//!
//! The window is `CKALLOC_RETAIN_DECAY_MS`, split into [`SLOTS_PER_WINDOW`]
//! slots of the monotonic clock; each slot keeps the highest count noted
//! in it.
//!
//! Demand that comes back is held longer: after decay gave memory back
//! ([`Demand::released`]), live bytes that rise above the count at that
//! moment within [`HOLD_NS`] show a demand that recurs (a server's next
//! burst after an idle spell); their peak, with no more slack than the
//! live bytes that came back, is kept as demand until [`HOLD_NS`] pass
//! with no note of a live count above the one at the release. A hold keeps
//! no more than that demand (with its slack) above the live bytes now, so
//! live bytes of the release's moment freed later (a model unloaded) are
//! not held. A transient
//! peak that never comes back is given back one window after it; a burst
//! after an idle spell longer than the window faults its memory in once,
//! and the spells after it keep it. Atomics only: no allocation, no lock.
//!
//! [`retain::decay`]: super::retain::decay

use crate::env;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

/// Slots the window is split into; the peak covers that many slots before
/// the current one, so a count leaves it between one window and one
/// window and a slot after it was seen.
pub(crate) const SLOTS_PER_WINDOW: u64 = 8;
/// Entries of the ring (more than the slots a peak reads).
const RING: usize = 16;
/// How long demand that came back after a release is held (30 s).
pub const HOLD_NS: u64 = 30_000_000_000;

/// The demand tracker (see the [module docs](self)).
pub(crate) struct Demand {
    /// The highest count noted in each slot, at `slot % RING`.
    peaks: [AtomicU64; RING],
    /// The slot number each entry holds (plus one: 0 is none).
    slots: [AtomicU64; RING],
    /// The live count when decay last gave memory back, and when (ns).
    released_live: AtomicU64,
    released_at: AtomicU64,
    /// The peak of demand that came back after that, and until when (ns)
    /// it is held.
    held: AtomicU64,
    held_until: AtomicU64,
    /// The most of that peak above the live count at the release: the
    /// most the hold keeps, whatever leaves the live bytes meanwhile.
    held_above: AtomicU64,
    /// When (ns) live bytes last grew.
    last_grew: AtomicU64,
}

/// The window in nanoseconds (`CKALLOC_RETAIN_DECAY_MS`).
pub(crate) fn window_ns() -> u64 {
    env::retain_decay_ms().saturating_mul(1_000_000)
}

/// The slot of monotonic time `now_ns` under a window of `window_ns`.
fn slot_at(now_ns: u64, window_ns: u64) -> u64 {
    now_ns / (window_ns / SLOTS_PER_WINDOW).max(1)
}

impl Demand {
    pub(crate) const fn new() -> Demand {
        Demand {
            peaks: [const { AtomicU64::new(0) }; RING],
            slots: [const { AtomicU64::new(0) }; RING],
            released_live: AtomicU64::new(0),
            released_at: AtomicU64::new(0),
            held: AtomicU64::new(0),
            held_until: AtomicU64::new(0),
            held_above: AtomicU64::new(0),
            last_grew: AtomicU64::new(0),
        }
    }

    /// Monotonic ns since live bytes last grew (an allocation).
    pub(crate) fn quiet_for(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.last_grew.load(Relaxed))
    }

    /// Live bytes grew to `live` at `now_ns`: noted, and the moment kept.
    #[inline]
    pub(crate) fn grew(&self, now_ns: u64, live: u64) {
        self.last_grew.store(now_ns, Relaxed);
        self.note(now_ns, live);
    }

    /// Decay gave memory back at `now_ns` with `live` bytes live.
    pub(crate) fn released(&self, now_ns: u64, live: u64) {
        self.released_live.store(live, Relaxed);
        self.released_at.store(now_ns.max(1), Relaxed);
    }

    /// Live bytes were `live` at monotonic time `now_ns`.
    #[inline]
    pub(crate) fn note(&self, now_ns: u64, live: u64) {
        self.note_with_slack(now_ns, live, 0);
    }

    /// At a miss at monotonic time `now_ns`: `live` bytes live with the new
    /// block, and `slack` retained bytes, freed within the window, that did
    /// not fit it (see the [module docs](self)). The window keeps
    /// `live + slack`; a hold keeps no more slack than the live bytes that
    /// came back since the release, so a miss after a release holds at most
    /// twice the demand that returned.
    #[inline]
    pub(crate) fn note_with_slack(&self, now_ns: u64, live: u64, slack: u64) {
        let bytes = live.saturating_add(slack);
        let window = window_ns();
        if window == 0 {
            return;
        }
        let slot = slot_at(now_ns, window) + 1;
        let i = (slot % RING as u64) as usize;
        let held = self.slots[i].load(Relaxed);
        // Only an older slot is replaced: a thread that read the clock
        // before another's note of a later slot adds to that one (more
        // demand, never less).
        if held < slot
            && self.slots[i]
                .compare_exchange(held, slot, Relaxed, Relaxed)
                .is_ok()
        {
            // The entry held an older slot: this one starts at `bytes`. A
            // thread's `fetch_max` between the exchange and this store is
            // lost: a live count is noted again at the next growth or
            // step, a miss's slack only at the next miss (the window then
            // keeps less, never more).
            self.peaks[i].store(bytes, Relaxed);
        }
        self.peaks[i].fetch_max(bytes, Relaxed);
        let at = self.released_at.load(Relaxed);
        let released_live = self.released_live.load(Relaxed);
        if at != 0 && now_ns.saturating_sub(at) < HOLD_NS && live > released_live {
            let back = live - released_live;
            let above = back.saturating_add(slack.min(back));
            let bytes = released_live.saturating_add(above);
            if self.held_until.load(Acquire) <= now_ns {
                // The last hold expired: this one starts at `bytes`. A note
                // that raised the hold meanwhile (another thread, at the
                // moment of expiry) is lowered to `bytes`: the hold then
                // keeps less than that note's peak, which the window's
                // slots still keep for one window.
                self.held.store(bytes, Relaxed);
                self.held_above.store(above, Relaxed);
            }
            self.held.fetch_max(bytes, Relaxed);
            self.held_above.fetch_max(above, Relaxed);
            // Release: a reader that sees the new deadline sees the hold.
            self.held_until
                .fetch_max(now_ns.saturating_add(HOLD_NS), Release);
        }
    }

    /// The highest count noted in the window before monotonic time
    /// `now_ns`, at least `live` (the count now).
    pub(crate) fn peak(&self, now_ns: u64, live: u64) -> u64 {
        let window = window_ns();
        if window == 0 {
            return live;
        }
        let slot = slot_at(now_ns, window) + 1;
        let oldest = slot.saturating_sub(SLOTS_PER_WINDOW);
        let mut peak = live;
        // Read only: an expired hold is replaced by the next note that
        // holds demand, so a reader never drops one a note just raised.
        // The hold keeps no more than the demand that came back (with its
        // slack) above the live bytes now: live bytes that were there at
        // the release and leave afterwards (a model unloaded) are not held.
        if now_ns < self.held_until.load(Acquire) {
            let held = self.held.load(Relaxed);
            let above = self.held_above.load(Relaxed);
            peak = peak.max(held.min(live.saturating_add(above)));
        }
        for (s, p) in self.slots.iter().zip(&self.peaks) {
            let held = s.load(Relaxed);
            if held != 0 && held >= oldest && held <= slot {
                peak = peak.max(p.load(Relaxed));
            }
        }
        peak
    }

    /// The retained bytes the window's demand can take back with
    /// `live` bytes live now: its peak less `live`.
    pub(crate) fn keep(&self, now_ns: u64, live: u64) -> u64 {
        self.peak(now_ns, live) - live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_peak_stays_one_window_and_then_leaves() {
        // The default window (env unset in unit tests): 2000 ms, 250 ms slots.
        let w = window_ns();
        assert!(w > 0);
        let d = Demand::new();
        let t0 = 1_000 * w;
        d.note(t0, 100);
        d.note(t0 + MS, 40);
        assert_eq!(d.keep(t0 + 2 * MS, 40), 60, "the peak is in the window");
        assert_eq!(d.keep(t0 + w / 2, 40), 60);
        assert_eq!(d.keep(t0 + w + w / SLOTS_PER_WINDOW + MS, 40), 0, "gone");
        // Live above every peak: nothing more to keep.
        assert_eq!(d.keep(t0 + 2 * MS, 500), 0);
    }

    #[test]
    fn demand_that_comes_back_after_a_release_is_held() {
        let w = window_ns();
        let d = Demand::new();
        let t0 = 1_000 * w;
        // A burst, then idle: given back after the window.
        d.note(t0, 100);
        let t1 = t0 + 2 * w;
        assert_eq!(d.keep(t1, 10), 0);
        d.released(t1, 10);
        // The next burst comes back to 100: held through later idle spells.
        d.note(t1 + 3 * w, 100);
        assert_eq!(d.keep(t1 + 6 * w, 10), 90);
        // A burst that never comes back is not held.
        assert_eq!(d.keep(t1 + 3 * w + HOLD_NS + w, 10), 0);
    }

    #[test]
    fn a_miss_slack_stays_a_window_and_is_held_up_to_the_demand_that_came_back() {
        let w = window_ns();
        let d = Demand::new();
        let t0 = 1_000 * w;
        // A miss with 40 live and 60 retained that did not fit: both kept.
        d.note_with_slack(t0, 40, 60);
        assert_eq!(d.keep(t0 + MS, 10), 90);
        assert_eq!(d.keep(t0 + w + w / SLOTS_PER_WINDOW + MS, 10), 0, "gone");
        // After a release at 500 live, 4 more live and 500 of slack: the
        // window keeps it all, the hold 4 of the slack.
        let t1 = t0 + 3 * w;
        d.released(t1, 500);
        d.note_with_slack(t1 + MS, 504, 500);
        assert_eq!(d.keep(t1 + 2 * MS, 500), 504);
        assert_eq!(d.keep(t1 + 3 * w, 500), 8, "504 live and 4 of slack");
        // No live demand back: a miss's slack is held not at all.
        let t2 = t1 + HOLD_NS + 10 * w;
        d.released(t2, 600);
        d.note_with_slack(t2 + MS, 600, 400);
        assert_eq!(d.keep(t2 + 3 * w, 600), 0);
    }

    #[test]
    fn a_peak_that_never_comes_back_is_not_held() {
        let w = window_ns();
        let d = Demand::new();
        d.note(w, 1_000);
        d.released(4 * w, 10);
        // Small requests after the release: only their own demand is held.
        d.note(5 * w, 13);
        assert_eq!(d.keep(9 * w, 10), 3);
    }

    #[test]
    fn a_hold_keeps_only_the_demand_that_came_back_when_older_live_bytes_leave() {
        let w = window_ns();
        let d = Demand::new();
        // 1,000 live for long (weights); a burst of 64 is given back and
        // comes back: held.
        d.released(w, 1_000);
        d.note_with_slack(2 * w, 1_064, 100);
        assert_eq!(d.keep(5 * w, 1_000), 128, "64 back and 64 of slack");
        // The 1,000 are freed: the hold keeps the 128 still, not 1,128.
        assert_eq!(d.keep(6 * w, 0), 128);
        assert_eq!(d.keep(6 * w, 10), 128);
    }

    #[test]
    fn an_expired_hold_is_not_carried_into_the_next_one() {
        let w = window_ns();
        let d = Demand::new();
        // A burst of 1,000 comes back after a release: held.
        d.released(w, 10);
        d.note(2 * w, 1_000);
        assert_eq!(d.keep(3 * w, 10), 990);
        // The hold expires with no reader in between; a later release and
        // a small return hold only that return.
        let t = 2 * w + HOLD_NS + 10 * w;
        d.released(t, 10);
        d.note(t + w, 13);
        assert_eq!(d.keep(t + 4 * w, 10), 3);
    }

    #[test]
    fn a_slot_reused_by_the_ring_starts_afresh() {
        let w = window_ns();
        let d = Demand::new();
        let slot = w / SLOTS_PER_WINDOW;
        d.note(0, 1_000);
        // The same ring entry, RING slots later.
        let later = RING as u64 * slot;
        d.note(later, 10);
        assert_eq!(d.peak(later, 0), 10);
        // A note of the older slot, from a thread that read the clock
        // before, does not take the entry back.
        d.note(0, 3);
        assert_eq!(d.peak(later, 0), 10);
    }
}
