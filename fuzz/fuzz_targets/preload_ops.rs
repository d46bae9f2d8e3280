//! Arbitrary sequences of the preload library's C API (`ckalloc::preload`:
//! malloc, calloc, realloc, reallocarray, memalign, posix_memalign, valloc,
//! pvalloc, free, malloc_usable_size, malloc_trim) on sizes around the
//! 2 MiB threshold, checked against a model of every live block's size and
//! bytes: alignment, usable size at least the size, huge blocks 2 MiB
//! aligned with their rounded length as usable size, contents kept by
//! realloc up to the smaller size, calloc blocks zero, failures only as
//! null with the old block intact.
//!
//! The exported symbols cannot be fuzzed in-process (the fuzzer's
//! AddressSanitizer replaces `malloc`), so the Rust entry points are
//! driven; their small requests reach glibc's `__libc_*` functions.
//! Alignments above 16 are used on huge sizes only: AddressSanitizer
//! intercepts `__libc_memalign`, whose blocks glibc's `__libc_free` cannot
//! take.
#![no_main]

use arbitrary::Arbitrary;
use ckalloc::preload as c;
use libfuzzer_sys::fuzz_target;
use std::ffi::c_void;

const MIB: usize = 1 << 20;
const THRESHOLD: usize = 2 * MIB;
const SLOTS: usize = 8;

#[derive(Arbitrary, Debug)]
enum Size {
    Small(u16),
    NearThreshold(i16),
    Huge { mib: u8, extra: u16 },
}

impl Size {
    fn bytes(&self) -> usize {
        match *self {
            Size::Small(n) => n as usize,
            Size::NearThreshold(d) => (THRESHOLD as isize + d as isize) as usize,
            Size::Huge { mib, extra } => (mib as usize % 40 + 2) * MIB + extra as usize,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    Malloc { slot: u8, size: Size },
    Calloc { slot: u8, n: u8, size: Size },
    Realloc { slot: u8, size: Size },
    ReallocArray { slot: u8, n: u16, each: u16 },
    Memalign { slot: u8, align_pow: u8, size: Size },
    PosixMemalign { slot: u8, align_pow: u8, size: Size },
    Valloc { slot: u8, size: Size, page_rounded: bool },
    Free { slot: u8 },
    Trim,
    Overflow,
}

#[derive(Clone, Copy)]
struct Block {
    p: *mut u8,
    size: usize,
    seed: u8,
}

/// Offsets written and checked: the first and last 64 bytes and one per 64 KiB.
fn offsets(size: usize) -> impl Iterator<Item = usize> {
    let head = 0..size.min(64);
    let tail = size.saturating_sub(64).max(size.min(64))..size;
    let mid = (64..size.saturating_sub(64)).step_by(64 << 10);
    head.chain(mid).chain(tail)
}

fn fill(b: &Block) {
    for i in offsets(b.size) {
        // SAFETY: `i < size`, inside the live block.
        unsafe { b.p.add(i).write(b.seed.wrapping_add(i as u8)) };
    }
}

fn check(b: &Block, upto: usize) {
    for i in offsets(b.size).filter(|&i| i < upto) {
        // SAFETY: as in `fill`.
        let v = unsafe { b.p.add(i).read() };
        assert_eq!(v, b.seed.wrapping_add(i as u8), "byte {i} of {}", b.size);
    }
}

fn check_shape(p: *mut c_void, size: usize, align: usize) {
    assert!(!p.is_null());
    assert_eq!(p as usize % align, 0, "alignment {align}");
    if size >= THRESHOLD {
        assert_eq!(p as usize % (2 * MIB), 0, "a huge block is 2 MiB aligned");
        // SAFETY: a live block of the API.
        let usable = unsafe { c::malloc_usable_size(p) };
        assert_eq!(usable, size.div_ceil(2 * MIB) * 2 * MIB);
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let mut slots: [Option<Block>; SLOTS] = [None; SLOTS];
    let mut seed = 1u8;
    let mut place = |slots: &mut [Option<Block>; SLOTS], slot: u8, p: *mut c_void, size: usize, zero: bool| {
        let k = slot as usize % SLOTS;
        if let Some(old) = slots[k].take() {
            check(&old, old.size);
            // SAFETY: a live block of the API.
            unsafe { c::free(old.p.cast()) };
        }
        if p.is_null() {
            return;
        }
        seed = seed.wrapping_add(1);
        let b = Block { p: p.cast(), size, seed };
        if zero {
            for i in offsets(size) {
                // SAFETY: inside the block.
                assert_eq!(unsafe { b.p.add(i).read() }, 0, "calloc byte {i}");
            }
        }
        fill(&b);
        slots[k] = Some(b);
    };
    for op in ops.iter().take(64) {
        match op {
            Op::Malloc { slot, size } => {
                let n = size.bytes();
                let p = c::malloc(n);
                check_shape(p, n, 16);
                place(&mut slots, *slot, p, n, false);
            }
            Op::Calloc { slot, n, size } => {
                let each = size.bytes() / (*n as usize % 4 + 1);
                let count = *n as usize % 4 + 1;
                let p = c::calloc(count, each);
                check_shape(p, count * each, 16);
                place(&mut slots, *slot, p, count * each, true);
            }
            Op::Realloc { slot, size } => {
                let k = *slot as usize % SLOTS;
                let n = size.bytes();
                let Some(old) = slots[k] else { continue };
                // SAFETY: a live block of the API.
                let p = unsafe { c::realloc(old.p.cast(), n) };
                if n == 0 {
                    assert!(p.is_null());
                    slots[k] = None;
                    continue;
                }
                check_shape(p, n, 16);
                let moved = Block { p: p.cast(), size: old.size, seed: old.seed };
                check(&moved, n);
                let b = Block { p: p.cast(), size: n, seed: old.seed };
                fill(&b);
                slots[k] = Some(b);
            }
            Op::ReallocArray { slot, n, each } => {
                let k = *slot as usize % SLOTS;
                let Some(old) = slots[k] else { continue };
                // Always overflows: the block stays as it was.
                // SAFETY: a live block of the API.
                let p = unsafe { c::reallocarray(old.p.cast(), usize::MAX / 2 + *n as usize, 2 + *each as usize) };
                assert!(p.is_null());
                check(&old, old.size);
            }
            Op::Memalign { slot, align_pow, size } | Op::PosixMemalign { slot, align_pow, size } => {
                let n = size.bytes().max(THRESHOLD);
                let align = 1usize << (align_pow % 31);
                let p = if matches!(op, Op::Memalign { .. }) {
                    c::memalign(align, n)
                } else {
                    let mut out = std::ptr::null_mut();
                    // SAFETY: a valid out pointer.
                    let r = unsafe { c::posix_memalign(&mut out, align, n) };
                    if align < 8 {
                        assert_eq!(r, libc::EINVAL);
                        continue;
                    }
                    assert_eq!(r, 0);
                    out
                };
                check_shape(p, n, align);
                place(&mut slots, *slot, p, n, false);
            }
            Op::Valloc { slot, size, page_rounded } => {
                let n = size.bytes().max(THRESHOLD);
                let p = if *page_rounded { c::pvalloc(n) } else { c::valloc(n) };
                check_shape(p, n, 4096);
                place(&mut slots, *slot, p, n, false);
            }
            Op::Free { slot } => {
                place(&mut slots, *slot, std::ptr::null_mut(), 0, false);
            }
            Op::Trim => {
                let _ = c::malloc_trim(0);
            }
            Op::Overflow => {
                assert!(c::calloc(usize::MAX / 2, 3).is_null());
                assert!(c::malloc(usize::MAX - 4096).is_null());
                assert!(c::memalign(1 << 21, usize::MAX - (1 << 20)).is_null());
            }
        }
    }
    for k in 0..SLOTS {
        if let Some(b) = slots[k].take() {
            check(&b, b.size);
            // SAFETY: a live block of the API.
            unsafe { c::free(b.p.cast()) };
        }
    }
});
