//! Numbered work items run on several threads: the calling thread and
//! scoped helpers take items from a shared counter until none is left. Used
//! by the parallel prefault of huge-page mappings and by the parallel copy
//! of a weights file into an arena. Only for explicit constructors and
//! methods: spawning threads allocates.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A raw address handed to worker threads, which use disjoint parts of the
/// memory behind it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendPtr(*mut u8);

// SAFETY: a `SendPtr` is only created through `SendPtr::new`, whose caller
// promises that the threads sharing it use disjoint bytes (or only pass
// addresses to the kernel) and that the memory outlives them.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// Wrap `ptr` for worker threads.
    ///
    /// # Safety
    /// Until every thread that receives a copy has been joined, the memory
    /// behind `ptr` stays mapped, and no two threads write the same byte
    /// through it (or read a byte another thread writes).
    pub(crate) unsafe fn new(ptr: *mut u8) -> SendPtr {
        SendPtr(ptr)
    }

    /// The address `offset` bytes on (a method, so closures capture the whole
    /// `Send` wrapper, not the raw pointer field). Computed with
    /// `wrapping_add`: the caller keeps `offset` inside the memory.
    pub(crate) fn at(self, offset: usize) -> *mut u8 {
        self.0.wrapping_add(offset)
    }
}

/// How many threads run the items, and how the helpers are started.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Workers {
    /// Threads in all, the calling thread included (0 counts as 1).
    pub threads: usize,
    /// Name of the helper threads (`None`: unnamed).
    pub name: Option<&'static str>,
    /// Stack size of the helper threads in bytes (`None`: std's default).
    pub stack_size: Option<usize>,
    /// How long the calling thread waits for its helpers to start before it
    /// takes its first item (zero: no wait).
    pub start_wait: Duration,
}

/// A failed item: its index and the error.
pub(crate) type Failure = (usize, io::Error);

impl Workers {
    /// Run `work(i)` once for every `i` in `0..count`. The calling thread
    /// works too and calls `progress` after each item it finished and, while
    /// helpers finish their last items, every 2 ms; without `progress` it
    /// just joins them. A helper that cannot be spawned is not an error: the
    /// others take its items. After a failure no new item is started; once
    /// every helper has been joined the failure with the lowest index is
    /// returned (a helper that panicked counts as item `usize::MAX`).
    pub(crate) fn run(
        &self,
        count: usize,
        work: impl Fn(usize) -> io::Result<()> + Sync,
        mut progress: Option<&mut dyn FnMut()>,
    ) -> Result<(), Failure> {
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let started = AtomicUsize::new(0);
        let finished = AtomicUsize::new(0);
        let (next, failed, started, finished, work) = (&next, &failed, &started, &finished, &work);
        // The next item: `None` when none is left or an item failed.
        let step = move || -> Option<Result<(), Failure>> {
            if failed.load(Ordering::Relaxed) {
                return None;
            }
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= count {
                return None;
            }
            Some(work(i).map_err(|e| {
                failed.store(true, Ordering::Relaxed);
                (i, e)
            }))
        };
        std::thread::scope(|scope| {
            let helpers: Vec<_> = (1..self.threads.min(count))
                .filter_map(|_| {
                    let mut b = std::thread::Builder::new();
                    if let Some(name) = self.name {
                        b = b.name(name.into());
                    }
                    if let Some(size) = self.stack_size {
                        b = b.stack_size(size);
                    }
                    b.spawn_scoped(scope, move || {
                        started.fetch_add(1, Ordering::Relaxed);
                        let mut result = Ok(());
                        while let Some(r) = step() {
                            if let Err(f) = r {
                                result = Err(f);
                                break;
                            }
                        }
                        finished.fetch_add(1, Ordering::Release);
                        result
                    })
                    .ok()
                })
                .collect();
            if !self.start_wait.is_zero() {
                let since = Instant::now();
                while started.load(Ordering::Relaxed) < helpers.len()
                    && since.elapsed() < self.start_wait
                {
                    std::thread::yield_now();
                }
            }
            let mut first = None;
            while let Some(r) = step() {
                if let Err(f) = r {
                    first = Some(f);
                    break;
                }
                if let Some(p) = progress.as_mut() {
                    p();
                }
            }
            if let Some(p) = progress.as_mut() {
                while finished.load(Ordering::Acquire) < helpers.len() {
                    std::thread::sleep(Duration::from_millis(2));
                    p();
                }
            }
            for helper in helpers {
                let outcome = helper.join().unwrap_or_else(|_| {
                    Err((usize::MAX, io::Error::other("a worker thread panicked")))
                });
                if let Err((i, e)) = outcome {
                    if first.as_ref().is_none_or(|(j, _)| i < *j) {
                        first = Some((i, e));
                    }
                }
            }
            first.map_or(Ok(()), Err)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(threads: usize) -> Workers {
        Workers {
            threads,
            name: Some("ckalloc-test"),
            stack_size: Some(64 << 10),
            start_wait: Duration::from_millis(1),
        }
    }

    #[test]
    fn every_item_runs_once() {
        for threads in [0, 1, 2, 4] {
            let hits: Vec<AtomicUsize> = (0..37).map(|_| AtomicUsize::new(0)).collect();
            let mut calls = 0;
            let mut p = || calls += 1;
            workers(threads)
                .run(
                    hits.len(),
                    |i| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    },
                    Some(&mut p),
                )
                .unwrap();
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            if threads <= 1 {
                assert_eq!(
                    calls,
                    hits.len(),
                    "one report per item of the calling thread"
                );
            }
        }
    }

    #[test]
    fn lowest_failed_item_is_reported() {
        let r = workers(1).run(
            10,
            |i| {
                if i >= 3 {
                    Err(io::Error::from_raw_os_error(i as i32))
                } else {
                    Ok(())
                }
            },
            None,
        );
        let (i, e) = r.unwrap_err();
        assert_eq!(i, 3);
        assert_eq!(e.raw_os_error(), Some(3));
    }

    #[test]
    fn zero_items_is_ok() {
        assert!(workers(4).run(0, |_| unreachable!(), None).is_ok());
    }
}
