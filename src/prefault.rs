//! Prefaulting a fresh mapping with `MADV_POPULATE_WRITE`, on one thread or
//! on several (see [`HugeOptions::populate_threads`](crate::HugeOptions::populate_threads)).

use crate::par::{SendPtr, Workers};
use crate::sys::{self, Advice};
use std::io;
use std::ptr::NonNull;
use std::time::Duration;

/// Bytes a prefault thread takes at a time (at least one huge page): small
/// enough that a thread the scheduler delays holds back little work, large
/// enough that the `madvise` calls cost nothing next to clearing the pages.
const POPULATE_CHUNK: usize = 8 << 20;

/// Stack size of a prefault helper thread: it only calls `madvise`.
const HELPER_STACK: usize = 64 << 10;

/// How long the calling thread waits for its helpers to start. A new thread
/// maps memory while it starts (its malloc arena, its signal stack), and each
/// such `mmap` needs the mmap_lock for writing, which a running
/// `MADV_POPULATE_WRITE` holds for reading. So the calling thread waits,
/// briefly, until the helpers run before it takes a chunk; a helper the
/// scheduler has not started by then costs at most this here, and later
/// waits for at most one chunk per `mmap` (one call per chunk).
const START_WAIT: Duration = Duration::from_millis(1);

fn populate_range(addr: *mut u8, len: usize) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    sys::madvise(addr, len, Advice::PopulateWrite)
}

/// `start..start+len` cut at the multiples of `chunk` (a power of two) in
/// address space: chunk `i` covers `base + i * chunk .. base + (i + 1) *
/// chunk`, clipped to the range.
#[derive(Clone, Copy, Debug)]
struct Chunks {
    start: usize,
    len: usize,
    /// `start` rounded down to `chunk`.
    base: usize,
    chunk: usize,
    count: usize,
}

impl Chunks {
    /// `None` when the end of the range, rounded up, overflows (never for a
    /// real mapping).
    fn new(start: usize, len: usize, chunk: usize) -> Option<Chunks> {
        let base = start & !(chunk - 1);
        let top = sys::round_up(start.checked_add(len)?, chunk)?;
        Some(Chunks {
            start,
            len,
            base,
            chunk,
            count: (top - base) / chunk,
        })
    }

    /// Offset from `start` and length of chunk `i` (`i < count`).
    fn get(&self, i: usize) -> (usize, usize) {
        // `base + count * chunk` was computed without overflow in `new`.
        let at = |k: usize| {
            k.checked_mul(self.chunk)
                .and_then(|o| self.base.checked_add(o))
                .map_or(self.len, |a| a.saturating_sub(self.start).min(self.len))
        };
        let (lo, hi) = (at(i), at(i + 1));
        (lo, hi - lo)
    }
}

/// How many threads prefault `chunks` chunks when `asked` were asked for (0:
/// all cores): at most `available_parallelism`, at most one per chunk.
fn populate_thread_count(asked: usize, chunks: usize) -> usize {
    if asked == 1 || chunks <= 1 {
        return 1;
    }
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let asked = if asked == 0 { cores } else { asked.min(cores) };
    asked.min(chunks).max(1)
}

/// Prefault `ptr..ptr+len` with `MADV_POPULATE_WRITE` on up to `threads`
/// threads (see [`HugeOptions::populate_threads`](crate::HugeOptions::populate_threads)):
/// the calling thread and its helpers take chunks of [`POPULATE_CHUNK`]
/// bytes (at least `granule`, the huge page size) from a shared counter
/// until none is left, so a helper that starts late or is scheduled out
/// holds back at most one chunk. After a failure no new chunk is started;
/// the error of the lowest failed chunk is returned once every thread has
/// been joined.
pub(crate) fn populate(
    ptr: NonNull<u8>,
    len: usize,
    granule: usize,
    threads: usize,
) -> io::Result<()> {
    if threads == 1 {
        return populate_range(ptr.as_ptr(), len);
    }
    let chunks = Chunks::new(ptr.as_ptr() as usize, len, granule.max(POPULATE_CHUNK))
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let n = populate_thread_count(threads, chunks.count);
    if n <= 1 {
        return populate_range(ptr.as_ptr(), len);
    }
    // SAFETY: the address is only passed to `madvise(MADV_POPULATE_WRITE)`,
    // which faults the pages in without reading or writing through the
    // pointer; the mapping belongs to the caller, which keeps it until
    // `run` has joined every thread.
    let base = unsafe { SendPtr::new(ptr.as_ptr()) };
    let workers = Workers {
        threads: n,
        name: None,
        stack_size: Some(HELPER_STACK),
        start_wait: START_WAIT,
    };
    workers
        .run(
            chunks.count,
            |i| {
                let (offset, len) = chunks.get(i);
                populate_range(base.at(offset), len)
            },
            None,
        )
        .map_err(|(_, e)| e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{HUGE_PAGE_1G, HUGE_PAGE_2M};

    const M2: usize = HUGE_PAGE_2M;

    /// Every chunk of `start..start+len`, checked to be consecutive, to
    /// cover the range and to end on multiples of `chunk`.
    fn check(start: usize, len: usize, chunk: usize) -> Vec<(usize, usize)> {
        let c = Chunks::new(start, len, chunk).unwrap();
        let all: Vec<_> = (0..c.count).map(|i| c.get(i)).collect();
        let mut next = 0;
        for &(off, l) in &all {
            assert_eq!(off, next, "consecutive: {all:?}");
            assert!(l > 0 && l <= chunk, "{all:?}");
            next = off + l;
            if next < len {
                assert_eq!((start + next) % chunk, 0, "aligned boundary: {all:?}");
            }
        }
        assert_eq!(next, len, "cover the range: {all:?}");
        all
    }

    #[test]
    fn chunks_aligned_and_odd() {
        let c = 4 * M2;
        assert_eq!(check(0x4000_0000, 8 * M2, c), [(0, c), (c, c)]);
        // A 10 MiB mapping: one whole chunk and a 2 MiB tail.
        assert_eq!(check(0x4000_0000, 5 * M2, c), [(0, c), (c, M2)]);
        assert_eq!(check(0x4000_0000, M2, c), [(0, M2)]);
        // 3 GiB of 1 GiB pages: one page per chunk.
        let g = HUGE_PAGE_1G;
        assert_eq!(check(4 * g, 3 * g, g), [(0, g), (g, g), (2 * g, g)]);
    }

    #[test]
    fn chunks_unaligned_start_keep_absolute_boundaries() {
        // An arena runtime range that starts 4 KiB past a 2 MiB boundary.
        let s = 0x4000_0000 + 4096;
        let all = check(s, 6 * M2, M2);
        assert_eq!(all.len(), 7);
        assert_eq!(all[0], (0, M2 - 4096));
        assert_eq!(all[6], (6 * M2 - 4096, 4096));
    }

    #[test]
    fn chunks_overflow_is_none() {
        assert!(Chunks::new(usize::MAX - M2, 2 * M2, M2).is_none());
        assert!(Chunks::new(usize::MAX - M2 + 2, M2 - 4, M2).is_none());
    }

    #[test]
    fn thread_count_limits() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(populate_thread_count(1, 128), 1);
        assert_eq!(populate_thread_count(8, 1), 1, "one chunk, one thread");
        assert_eq!(populate_thread_count(0, 128), cores);
        assert_eq!(populate_thread_count(usize::MAX, 128), cores);
        assert_eq!(populate_thread_count(2, 2), cores.min(2));
        assert_eq!(populate_thread_count(64, 3), cores.min(3));
    }
}
