//! Atomic bitmaps of [`BITS`] bits (a huge-page span's units: in use,
//! retained, advised), after mimalloc's arena bitmaps, and the plain-word
//! helpers that search a snapshot of one for runs.
//!
//! A range of bits is set all or nothing by [`Bits::try_set`]: word by word
//! with a compare-and-swap each, undoing the words already set when a later
//! one has a bit set by another thread. No lock, no allocation.

use std::sync::atomic::{AtomicU64, Ordering};

/// Words of a bitmap.
pub(crate) const WORDS: usize = 8;
/// Bits of a bitmap.
pub(crate) const BITS: u32 = WORDS as u32 * 64;

/// A plain copy of a bitmap's words.
pub(crate) type Snapshot = [u64; WORDS];

/// The words and masks of bits `start..start + n` (within [`BITS`]).
fn masks(start: u32, n: u32) -> impl Iterator<Item = (usize, u64)> {
    let end = start + n;
    (start / 64..end.div_ceil(64)).map(move |w| {
        let lo = start.max(w * 64) - w * 64;
        let hi = end.min(w * 64 + 64) - w * 64;
        let mask = if hi - lo == 64 {
            u64::MAX
        } else {
            ((1u64 << (hi - lo)) - 1) << lo
        };
        (w as usize, mask)
    })
}

/// [`BITS`] bits in atomic words.
pub(crate) struct Bits([AtomicU64; WORDS]);

impl Bits {
    pub(crate) const fn new() -> Bits {
        Bits([const { AtomicU64::new(0) }; WORDS])
    }

    /// The words now (each read on its own: a snapshot of a bitmap other
    /// threads change mixes moments, which callers recheck by claiming).
    pub(crate) fn snapshot(&self) -> Snapshot {
        std::array::from_fn(|w| self.0[w].load(Ordering::Acquire))
    }

    /// Store every word (a span being set up or repaired, which no other
    /// thread uses yet).
    pub(crate) fn store(&self, words: Snapshot) {
        for (a, w) in self.0.iter().zip(words) {
            a.store(w, Ordering::SeqCst);
        }
    }

    /// Set bits `start..start + n` if every one of them is clear, else set
    /// none; `true` when they were set.
    pub(crate) fn try_set(&self, start: u32, n: u32) -> bool {
        let mut done = 0;
        for (i, (w, mask)) in masks(start, n).enumerate() {
            let word = &self.0[w];
            let mut cur = word.load(Ordering::Relaxed);
            let taken = loop {
                if cur & mask != 0 {
                    break false;
                }
                match word.compare_exchange_weak(
                    cur,
                    cur | mask,
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break true,
                    Err(now) => cur = now,
                }
            };
            if !taken {
                for (w, mask) in masks(start, n).take(done) {
                    self.0[w].fetch_and(!mask, Ordering::Release);
                }
                return false;
            }
            done = i + 1;
        }
        true
    }

    /// Set bits `start..start + n`.
    pub(crate) fn set(&self, start: u32, n: u32) {
        for (w, mask) in masks(start, n) {
            self.0[w].fetch_or(mask, Ordering::Release);
        }
    }

    /// Clear bits `start..start + n`.
    pub(crate) fn clear(&self, start: u32, n: u32) {
        for (w, mask) in masks(start, n) {
            self.0[w].fetch_and(!mask, Ordering::Release);
        }
    }

    /// How many of bits `start..start + n` are set now.
    pub(crate) fn count(&self, start: u32, n: u32) -> u32 {
        masks(start, n)
            .map(|(w, mask)| (self.0[w].load(Ordering::Acquire) & mask).count_ones())
            .sum()
    }
}

/// How many of bits `start..start + n` of `words` are set.
pub(crate) fn count(words: &Snapshot, start: u32, n: u32) -> u32 {
    masks(start, n)
        .map(|(w, mask)| (words[w] & mask).count_ones())
        .sum()
}

/// `a & b`, word by word.
pub(crate) fn and(a: &Snapshot, b: &Snapshot) -> Snapshot {
    std::array::from_fn(|w| a[w] & b[w])
}

/// `!a`, limited to the first `limit` bits.
pub(crate) fn not_below(a: &Snapshot, limit: u32) -> Snapshot {
    let mut out = [0; WORDS];
    for (w, mask) in masks(0, limit) {
        out[w] = !a[w] & mask;
    }
    out
}

/// `!a`, word by word.
pub(crate) fn not(a: &Snapshot) -> Snapshot {
    a.map(|w| !w)
}

/// The bits of `a` in `s..e`.
pub(crate) fn within(a: &Snapshot, s: u32, e: u32) -> Snapshot {
    let range = and(&not_below(&[0; WORDS], e), &not(&not_below(&[0; WORDS], s)));
    and(a, &range)
}

/// The maximal runs of set bits of `words`, as `start..end`, in order.
pub(crate) fn runs(words: &Snapshot) -> impl Iterator<Item = (u32, u32)> {
    let (words, mut i) = (*words, 0);
    std::iter::from_fn(move || {
        let start = next(&words, i, true)?;
        i = next(&words, start, false).unwrap_or(BITS);
        Some((start, i))
    })
}

/// The first bit at or after `from` whose value is `value`.
fn next(words: &Snapshot, from: u32, value: bool) -> Option<u32> {
    let mut i = from;
    while i < BITS {
        let w = (i / 64) as usize;
        let word = if value { words[w] } else { !words[w] } >> (i % 64);
        if word != 0 {
            return Some(i + word.trailing_zeros());
        }
        i = (w as u32 + 1) * 64;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_bits(bits: &[u32]) -> Snapshot {
        let mut s = [0; WORDS];
        for &b in bits {
            s[(b / 64) as usize] |= 1 << (b % 64);
        }
        s
    }

    #[test]
    fn runs_cross_words_and_end_at_the_last_bit() {
        let mut bits: Vec<u32> = (60..70).collect();
        bits.extend([0, 1, 2, 200]);
        bits.extend(500..512);
        let s = from_bits(&bits);
        let r: Vec<_> = runs(&s).collect();
        assert_eq!(r, vec![(0, 3), (60, 70), (200, 201), (500, 512)]);
        let full = [u64::MAX; WORDS];
        assert_eq!(runs(&full).collect::<Vec<_>>(), vec![(0, 512)]);
        assert_eq!(runs(&[0; WORDS]).count(), 0);
        let words = from_bits(&(0..128).collect::<Vec<_>>());
        assert_eq!(runs(&words).collect::<Vec<_>>(), vec![(0, 128)]);
    }

    #[test]
    fn a_range_is_set_all_or_nothing() {
        let b = Bits::new();
        assert!(b.try_set(60, 70));
        assert_eq!(b.count(0, BITS), 70);
        // Overlaps the end of the first range: nothing of it is set.
        assert!(!b.try_set(120, 200));
        assert_eq!(b.count(0, BITS), 70);
        assert!(b.try_set(130, 382));
        assert_eq!(b.count(0, BITS), 452);
        b.clear(60, 70);
        assert_eq!(b.count(0, 130), 0);
        assert_eq!(count(&b.snapshot(), 130, 382), 382);
        let free = not_below(&b.snapshot(), 500);
        assert_eq!(runs(&free).collect::<Vec<_>>(), vec![(0, 130)]);
    }

    #[test]
    fn racing_threads_never_set_one_bit_twice() {
        let b = Bits::new();
        let won: Vec<u32> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4u32)
                .map(|t| {
                    let b = &b;
                    s.spawn(move || {
                        let mut got = 0;
                        for start in (0..BITS - 40).step_by(7) {
                            if b.try_set((start + t * 3) % (BITS - 40), 40) {
                                got += 40;
                            }
                        }
                        got
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(won.iter().sum::<u32>(), b.count(0, BITS));
    }
}
