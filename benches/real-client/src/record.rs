//! A recording global allocator and the trace format it writes.
//!
//! [`Recorder`] serves every request from [`System`] and appends one
//! [`Event`] per successful `alloc`, `alloc_zeroed`, `dealloc` and `realloc`
//! to a buffer of [`CAPACITY`] events (an anonymous mapping made on the
//! first request; only the part written is faulted in). It never allocates
//! while it records. A spin lock serialises the call into `System` with the append,
//! so that the buffer's order is an order in which the requests really
//! happened, whatever thread made them (a free is recorded before the
//! address can be handed out again).
//!
//! After the run, [`stop`] ends the recording and [`encode`] turns the
//! events into the trace format, which names blocks by a sequence number
//! instead of an address:
//!
//! ```text
//! "CKTRACE1"                                      magic, 8 bytes
//! then records, each a tag byte and LEB128 fields:
//!   0 alloc          size, log2(align)            the block gets the next id
//!   1 alloc_zeroed   size, log2(align)            the block gets the next id
//!   2 free           age                          id = newest id - age
//!   3 realloc        age, new size                the block keeps its id
//!   4 mark           phase (0 load, 1 forward, 2 end)[, pass if forward]
//! ```
//!
//! Every request is kept, small ones included. Blocks still live at the
//! end have no `free` record. `benches/compare/trace.rs` in the root crate
//! reads the format (gzip-compressed).

use crate::Phase;
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::hint::spin_loop;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

/// Events the buffer holds (32 bytes each: 128 MiB of address space).
pub const CAPACITY: usize = 1 << 22;

/// The kinds of [`Event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Kind {
    Alloc = 0,
    AllocZeroed = 1,
    Free = 2,
    Realloc = 3,
    Mark = 4,
}

/// One recorded request.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct Event {
    pub kind: Kind,
    /// log2 of the alignment; for a mark, the phase (0 load, 1 forward, 2 end).
    pub align_log2: u32,
    /// The block's address (the old address for a realloc; a mark's pass).
    pub ptr: usize,
    /// The new address of a realloc.
    pub new_ptr: usize,
    /// The size requested (the new size for a realloc).
    pub size: usize,
}

/// The event buffer: an anonymous mapping of `CAPACITY` events made on the
/// first append (a system call, not an allocation), written and read with
/// `LOCK` held, or read after `stop`.
static BUFFER: AtomicPtr<Event> = AtomicPtr::new(ptr::null_mut());
static LEN: AtomicUsize = AtomicUsize::new(0);
static LOCK: AtomicBool = AtomicBool::new(false);
static RECORDING: AtomicBool = AtomicBool::new(true);
static OVERFLOW: AtomicBool = AtomicBool::new(false);

struct Guard;

impl Guard {
    fn lock() -> Guard {
        while LOCK
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spin_loop();
        }
        Guard
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        LOCK.store(false, Ordering::Release);
    }
}

/// Append `ev` (the caller holds the lock).
fn push(_held: &Guard, ev: Event) {
    if !RECORDING.load(Ordering::Relaxed) {
        return;
    }
    let n = LEN.load(Ordering::Relaxed);
    if n >= CAPACITY {
        OVERFLOW.store(true, Ordering::Relaxed);
        return;
    }
    let mut buf = BUFFER.load(Ordering::Relaxed);
    if buf.is_null() {
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // touched. `MAP_NORESERVE`: only the pages written are committed.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                CAPACITY * std::mem::size_of::<Event>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            OVERFLOW.store(true, Ordering::Relaxed);
            return;
        }
        buf = p.cast();
        BUFFER.store(buf, Ordering::Relaxed);
    }
    // SAFETY: slot `n` is inside the mapping and only written with the lock
    // held.
    unsafe { buf.add(n).write(ev) };
    LEN.store(n + 1, Ordering::Relaxed);
}

fn log2(align: usize) -> u32 {
    align.trailing_zeros()
}

/// A [`System`]-backed global allocator that records every request.
pub struct Recorder;

// SAFETY: every request is forwarded to `System` unchanged.
unsafe impl GlobalAlloc for Recorder {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let g = Guard::lock();
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            push(
                &g,
                Event {
                    kind: Kind::Alloc,
                    align_log2: log2(layout.align()),
                    ptr: p as usize,
                    new_ptr: 0,
                    size: layout.size(),
                },
            );
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let g = Guard::lock();
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            push(
                &g,
                Event {
                    kind: Kind::AllocZeroed,
                    align_log2: log2(layout.align()),
                    ptr: p as usize,
                    new_ptr: 0,
                    size: layout.size(),
                },
            );
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let g = Guard::lock();
        push(
            &g,
            Event {
                kind: Kind::Free,
                align_log2: log2(layout.align()),
                ptr: ptr as usize,
                new_ptr: 0,
                size: layout.size(),
            },
        );
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) };
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let g = Guard::lock();
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            push(
                &g,
                Event {
                    kind: Kind::Realloc,
                    align_log2: log2(layout.align()),
                    ptr: ptr as usize,
                    new_ptr: p as usize,
                    size: new_size,
                },
            );
        }
        p
    }
}

/// Record a phase mark.
pub fn mark(phase: Phase) {
    let (code, pass) = match phase {
        Phase::Load => (0, 0),
        Phase::Forward(n) => (1, n as usize),
        Phase::End => (2, 0),
    };
    let g = Guard::lock();
    push(
        &g,
        Event {
            kind: Kind::Mark,
            align_log2: code,
            ptr: pass,
            new_ptr: 0,
            size: 0,
        },
    );
}

/// End the recording and return the events, or `Err` with the capacity if
/// the buffer overflowed.
pub fn stop() -> Result<&'static [Event], usize> {
    let _g = Guard::lock();
    RECORDING.store(false, Ordering::Relaxed);
    if OVERFLOW.load(Ordering::Relaxed) {
        return Err(CAPACITY);
    }
    let n = LEN.load(Ordering::Relaxed);
    let buf = BUFFER.load(Ordering::Relaxed);
    if buf.is_null() {
        return Ok(&[]);
    }
    // SAFETY: recording is off, so no slot is written again; the `n` slots
    // were written with the lock held, which we took after them; the
    // mapping is never unmapped.
    Ok(unsafe { std::slice::from_raw_parts(buf, n) })
}

fn leb(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// Counts of an encoded trace.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    pub allocs: u64,
    pub frees: u64,
    pub reallocs: u64,
    /// Allocations of at least 2 MiB (the `CkHuge::new()` threshold).
    pub allocs_2m: u64,
    /// Bytes requested by allocations and growing reallocs.
    pub bytes: u64,
    /// Bytes requested by allocations of at least 2 MiB.
    pub bytes_2m: u64,
    /// Largest number of bytes live at once.
    pub peak_live: u64,
    /// Blocks live at the end.
    pub live_at_end: u64,
}

/// Encode `events` in the trace format (uncompressed). Fails on a free or
/// realloc of an address no recorded allocation returned.
pub fn encode(events: &[Event]) -> Result<(Vec<u8>, Summary), String> {
    const MIB2: usize = 2 << 20;
    let mut out = b"CKTRACE1".to_vec();
    let mut ids: HashMap<usize, (u64, usize)> = HashMap::new();
    let mut next: u64 = 0;
    let mut s = Summary::default();
    let mut live: u64 = 0;
    for (i, e) in events.iter().enumerate() {
        match e.kind {
            Kind::Alloc | Kind::AllocZeroed => {
                out.push(e.kind as u8);
                leb(&mut out, e.size as u64);
                out.push(e.align_log2 as u8);
                if ids.insert(e.ptr, (next, e.size)).is_some() {
                    return Err(format!("event {i}: address {:#x} handed out twice", e.ptr));
                }
                next += 1;
                s.allocs += 1;
                s.bytes += e.size as u64;
                live += e.size as u64;
                if e.size >= MIB2 {
                    s.allocs_2m += 1;
                    s.bytes_2m += e.size as u64;
                }
            }
            Kind::Free => {
                let (id, size) = ids
                    .remove(&e.ptr)
                    .ok_or_else(|| format!("event {i}: free of unknown address {:#x}", e.ptr))?;
                out.push(2);
                leb(&mut out, next - 1 - id);
                s.frees += 1;
                live -= size as u64;
            }
            Kind::Realloc => {
                let (id, size) = ids
                    .remove(&e.ptr)
                    .ok_or_else(|| format!("event {i}: realloc of unknown address {:#x}", e.ptr))?;
                if ids.insert(e.new_ptr, (id, e.size)).is_some() {
                    return Err(format!(
                        "event {i}: address {:#x} handed out twice",
                        e.new_ptr
                    ));
                }
                out.push(3);
                leb(&mut out, next - 1 - id);
                leb(&mut out, e.size as u64);
                s.reallocs += 1;
                s.bytes += (e.size as u64).saturating_sub(size as u64);
                live = live - size as u64 + e.size as u64;
            }
            Kind::Mark => {
                out.push(4);
                out.push(e.align_log2 as u8);
                if e.align_log2 == 1 {
                    leb(&mut out, e.ptr as u64);
                }
            }
        }
        s.peak_live = s.peak_live.max(live);
    }
    s.live_at_end = ids.len() as u64;
    Ok((out, s))
}
