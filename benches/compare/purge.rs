//! Row 9: how the engine purges retained units. A 64 MiB THP range, written
//! whole (a retained block), is purged with `MADV_DONTNEED` (ckalloc's
//! choice) or `MADV_FREE` (the peer), then written whole again (the block
//! reused). Reported: the time of purge + reuse, and the resident set of
//! the range right after the purge (what a purge is for). The two run
//! alternately on two ranges of their own, the memory state prepared before
//! each repetition (a fresh THP range written and unmapped, so that both
//! find free 2 MiB blocks at hand).

use crate::pages::Raw;
use crate::{fmt_dur, median, time, Row};
use std::hint::black_box;

const MIB: usize = 1 << 20;
const LEN: usize = 64 * MIB;

/// A THP range of `LEN` bytes, 2 MiB aligned, written whole.
struct Range(Raw);

impl Range {
    fn new() -> Range {
        let r = Range(Raw::new(LEN, true));
        r.write();
        r
    }

    fn write(&self) {
        // SAFETY: `LEN` bytes from the range's start are ours, read-write.
        unsafe { std::ptr::write_bytes(self.0.ptr(), 1, LEN) };
        black_box(self.0.ptr());
    }

    fn purge(&self, advice: libc::c_int) {
        // SAFETY: advice on a range of ours that nothing else refers to.
        let rc = unsafe { libc::madvise(self.0.ptr().cast(), LEN, advice) };
        assert_eq!(rc, 0, "madvise {advice}");
    }

    /// Resident bytes of the range (`mincore`).
    fn resident(&self) -> usize {
        let pages = LEN / 4096;
        let mut v = vec![0u8; pages];
        // SAFETY: `v` holds one byte per page of the range.
        let rc = unsafe { libc::mincore(self.0.ptr().cast(), LEN, v.as_mut_ptr()) };
        assert_eq!(rc, 0);
        v.iter().filter(|&&b| b & 1 == 1).count() * 4096
    }
}

pub fn purge(full: bool) -> Vec<Row> {
    let reps = if full { 15 } else { 7 };
    let (dontneed, free) = (Range::new(), Range::new());
    let (mut ours, mut peer, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut rss_ours, mut rss_peer) = (Vec::new(), Vec::new());
    for i in 0..reps {
        // The memory state: free 2 MiB blocks at hand for both.
        drop(Range::new());
        let one = |r: &Range, advice, rss: &mut Vec<f64>| {
            let (t1, ()) = time(|| r.purge(advice));
            rss.push(r.resident() as f64);
            let (t2, ()) = time(|| r.write());
            (t1 + t2).as_nanos() as f64
        };
        let (a, b) = if i % 2 == 0 {
            let a = one(&dontneed, libc::MADV_DONTNEED, &mut rss_ours);
            (a, one(&free, libc::MADV_FREE, &mut rss_peer))
        } else {
            let b = one(&free, libc::MADV_FREE, &mut rss_peer);
            (one(&dontneed, libc::MADV_DONTNEED, &mut rss_ours), b)
        };
        ours.push(a);
        peer.push(b);
        ratios.push(b / a);
    }
    let mib = |v: Vec<f64>| median(v) / MIB as f64;
    let (rss_a, rss_b) = (mib(rss_ours), mib(rss_peer));
    vec![Row {
        name: format!(
            "9. purge + reuse 64 MiB THP: MADV_DONTNEED vs MADV_FREE (resident after purge: {rss_a:.0} vs {rss_b:.0} MiB)"
        ),
        ours: fmt_dur(median(ours)),
        peer: fmt_dur(median(peer)),
        ratio: median(ratios),
        target: "resident 0".into(),
        met: rss_a == 0.0,
    }]
}
