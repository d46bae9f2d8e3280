//! For the caching tests: a counting inner allocator over allocator-api2's
//! `Global` that checks layouts and can inject failures.

use std::alloc::Layout;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Mutex;

use allocator_api2::alloc::{AllocError, Allocator, Global};

/// What the inner allocator saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Alloc(usize, usize),   // size, align
    Dealloc(usize, usize), // size, align
    Fail(usize),
}

/// Counts calls, remembers live blocks' layouts, and fails the next
/// `fail_next` allocations.
#[derive(Default)]
pub struct Counting {
    pub allocs: AtomicUsize,
    pub deallocs: AtomicUsize,
    pub fail_next: AtomicUsize,
    pub live: Mutex<HashMap<usize, Layout>>,
    pub events: Mutex<Vec<Event>>,
}

impl Counting {
    pub fn new() -> Counting {
        Counting::default()
    }
    pub fn live_blocks(&self) -> usize {
        self.live.lock().unwrap().len()
    }
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }
    pub fn clear_events(&self) {
        self.events.lock().unwrap().clear();
    }
    pub fn fail(&self, n: usize) {
        self.fail_next.store(n, SeqCst);
    }
}

// SAFETY: every block comes from `Global` and goes back to `Global` with the
// layout it was allocated with (asserted in `deallocate`); the bookkeeping
// never touches the blocks, so `Global`'s guarantees carry over unchanged.
unsafe impl Allocator for Counting {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if self
            .fail_next
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            self.events.lock().unwrap().push(Event::Fail(layout.size()));
            return Err(AllocError);
        }
        let p = Global.allocate(layout)?;
        self.allocs.fetch_add(1, SeqCst);
        self.live
            .lock()
            .unwrap()
            .insert(p.cast::<u8>().as_ptr() as usize, layout);
        self.events
            .lock()
            .unwrap()
            .push(Event::Alloc(layout.size(), layout.align()));
        Ok(p)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        let was = self.live.lock().unwrap().remove(&(ptr.as_ptr() as usize));
        assert_eq!(
            was,
            Some(layout),
            "block must go back with the layout it was allocated with"
        );
        self.deallocs.fetch_add(1, SeqCst);
        self.events
            .lock()
            .unwrap()
            .push(Event::Dealloc(layout.size(), layout.align()));
        // SAFETY: the caller's contract makes `ptr` a live block of this
        // allocator, so `allocate` got it from `Global` with `layout`.
        unsafe { Global.deallocate(ptr, layout) }
    }
}
