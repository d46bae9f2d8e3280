//! The block registry: the mapped length of every live huge-page block,
//! found from the block's address alone, for callers whose `free` carries
//! no size or a size they cannot trust (the C ABI's `ck_huge_free`, and a
//! `free` that knows only a pointer).
//!
//! # Layout
//!
//! A two-level radix map over the 2 MiB-aligned addresses of the 47-bit user
//! address space (x86_64 and aarch64 Linux without a 5-level hint), after
//! tcmalloc's page map: a static root of [`ROOT_LEN`] pointers (128 KiB of
//! zero-filled `.bss`, resident only where touched) to leaves of
//! [`LEAF_LEN`] words, each leaf covering 8 GiB of address space. A word
//! holds the block's mapped length in bytes, or 0 for no block. A leaf is
//! mapped (`mmap`, 32 KiB) the first time a block starts in its range and is
//! never unmapped, so a reader needs no lock and a lookup is two loads.
//!
//! Registering and removing are one atomic compare-and-swap or swap of a
//! word: thread-safe, lock-free, no allocation through any allocator (and so
//! usable inside `malloc`), nothing to repair after `fork()`.

use crate::sys::{self, HUGE_PAGE_2M};
use std::ptr::{self, NonNull};
use std::sync::atomic::{
    AtomicPtr, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

/// Bits of a user-space address (x86_64 and aarch64 with 4-level paging;
/// Linux maps above this only when asked with a hint).
const ADDRESS_BITS: u32 = 47;
/// Bits of the index of a 2 MiB-aligned address.
const KEY_BITS: u32 = ADDRESS_BITS - HUGE_PAGE_2M.trailing_zeros();
/// Bits of the index within a leaf.
const LEAF_BITS: u32 = 12;
/// Words per leaf (8 GiB of address space, 32 KiB of memory).
pub(crate) const LEAF_LEN: usize = 1 << LEAF_BITS;
/// Leaves the root points to.
pub(crate) const ROOT_LEN: usize = 1 << (KEY_BITS - LEAF_BITS);

struct Leaf {
    lens: [AtomicUsize; LEAF_LEN],
}

static ROOT: [AtomicPtr<Leaf>; ROOT_LEN] = [const { AtomicPtr::new(ptr::null_mut()) }; ROOT_LEN];

/// Why a block could not be registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RegisterError {
    /// The address is not 2 MiB aligned, or lies above the 47-bit user
    /// address space.
    Address,
    /// A block is already registered at this address.
    Taken,
    /// Mapping a leaf failed (`ENOMEM`).
    NoMemory,
}

impl std::fmt::Display for RegisterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RegisterError::Address => {
                "the block registry holds 2 MiB-aligned addresses below 2^47 only"
            }
            RegisterError::Taken => "the block registry already holds a block at this address",
            RegisterError::NoMemory => "no memory for a leaf of the block registry (ENOMEM)",
        })
    }
}

/// The root index and leaf index of `addr`, `None` for an address that is
/// not 2 MiB aligned or lies above [`ADDRESS_BITS`].
#[inline]
fn key(addr: usize) -> Option<(usize, usize)> {
    if !addr.is_multiple_of(HUGE_PAGE_2M) || addr >> ADDRESS_BITS != 0 {
        return None;
    }
    let k = addr / HUGE_PAGE_2M;
    Some((k >> LEAF_BITS, k & (LEAF_LEN - 1)))
}

/// The word of `addr`, `None` when its leaf was never mapped.
#[inline]
fn word(addr: usize) -> Option<&'static AtomicUsize> {
    let (r, i) = key(addr)?;
    let leaf = ROOT[r].load(Acquire);
    // SAFETY: a non-null root entry points to a leaf mapped read-write and
    // never unmapped (zero-filled memory is a valid array of atomics).
    let leaf = unsafe { leaf.as_ref() }?;
    Some(&leaf.lens[i])
}

/// The leaf of root entry `r`, mapped now if it was not yet.
fn leaf(r: usize) -> Result<&'static Leaf, RegisterError> {
    let existing = ROOT[r].load(Acquire);
    if !existing.is_null() {
        // SAFETY: as in `word`.
        return Ok(unsafe { &*existing });
    }
    map_leaf(r)
}

/// Map a leaf for root entry `r` and publish it, unless another thread
/// published one first.
#[cold]
fn map_leaf(r: usize) -> Result<&'static Leaf, RegisterError> {
    let len = std::mem::size_of::<Leaf>();
    let fresh = sys::map_anon_aligned(len, sys::page_size())
        .map_err(|_| RegisterError::NoMemory)?
        .cast::<Leaf>();
    match ROOT[r].compare_exchange(ptr::null_mut(), fresh.as_ptr(), AcqRel, Acquire) {
        // SAFETY: the fresh leaf is mapped, zero-filled and now published.
        Ok(_) => Ok(unsafe { fresh.as_ref() }),
        Err(winner) => {
            // Another thread published its leaf first: use it, drop ours.
            let _ = sys::munmap_best_effort(fresh.as_ptr().cast(), len);
            // SAFETY: as in `word`.
            Ok(unsafe { &*winner })
        }
    }
}

/// Record that a block of `len` bytes (non-zero) starts at `ptr`.
pub(crate) fn register(ptr: NonNull<u8>, len: usize) -> Result<(), RegisterError> {
    let (r, i) = key(ptr.as_ptr() as usize).ok_or(RegisterError::Address)?;
    leaf(r)?.lens[i]
        .compare_exchange(0, len.max(1), Release, Relaxed)
        .map(|_| ())
        .map_err(|_| RegisterError::Taken)
}

/// The mapped length of the block registered at `ptr`, removed from the
/// registry; `None` when no block starts at `ptr` (never registered, or
/// removed already). Of two racing removals of one block, one gets it.
pub(crate) fn remove(ptr: *mut u8) -> Option<usize> {
    let len = word(ptr as usize)?.swap(0, AcqRel);
    (len != 0).then_some(len)
}

/// The mapped length of the block registered at `ptr`, `None` when no
/// block starts there. Two loads; touches no memory at `ptr`.
#[cfg_attr(not(feature = "preload"), allow(dead_code))]
#[inline]
pub(crate) fn lookup(ptr: *const u8) -> Option<usize> {
    let len = word(ptr as usize)?.load(Acquire);
    (len != 0).then_some(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped_len(ptr: *const u8) -> Option<usize> {
        lookup(ptr)
    }

    fn at(addr: usize) -> NonNull<u8> {
        NonNull::new(addr as *mut u8).unwrap()
    }

    // The registry is process-wide and the unit tests of the crate run in
    // one process: these addresses are far from anything mapped.
    const BASE: usize = 0x5000_0000_0000;

    #[test]
    fn a_block_is_found_by_its_address_and_removed_once() {
        let p = at(BASE);
        assert_eq!(mapped_len(p.as_ptr()), None);
        register(p, 6 * HUGE_PAGE_2M).unwrap();
        assert_eq!(mapped_len(p.as_ptr()), Some(6 * HUGE_PAGE_2M));
        assert_eq!(register(p, HUGE_PAGE_2M), Err(RegisterError::Taken));
        assert_eq!(remove(p.as_ptr()), Some(6 * HUGE_PAGE_2M));
        assert_eq!(remove(p.as_ptr()), None, "a second free finds nothing");
        assert_eq!(mapped_len(p.as_ptr()), None);
    }

    #[test]
    fn addresses_the_map_cannot_hold_are_refused() {
        assert_eq!(
            register(at(BASE + 4096), HUGE_PAGE_2M),
            Err(RegisterError::Address)
        );
        assert_eq!(
            register(at(1 << 47), HUGE_PAGE_2M),
            Err(RegisterError::Address)
        );
        assert_eq!(mapped_len((BASE + 1) as *const u8), None);
        assert_eq!(remove(usize::MAX as *mut u8), None);
        // Neighbours in one leaf and across leaves are independent.
        let leaf_span = LEAF_LEN * HUGE_PAGE_2M;
        for (k, addr) in [
            BASE + leaf_span,
            BASE + leaf_span + HUGE_PAGE_2M,
            BASE + 2 * leaf_span - HUGE_PAGE_2M,
        ]
        .into_iter()
        .enumerate()
        {
            register(at(addr), (k + 1) * HUGE_PAGE_2M).unwrap();
        }
        assert_eq!(
            mapped_len((BASE + leaf_span + HUGE_PAGE_2M) as *const u8),
            Some(2 * HUGE_PAGE_2M)
        );
        for addr in [
            BASE + leaf_span,
            BASE + leaf_span + HUGE_PAGE_2M,
            BASE + 2 * leaf_span - HUGE_PAGE_2M,
        ] {
            assert!(remove(addr as *mut u8).is_some());
        }
    }

    #[test]
    fn racing_threads_register_and_remove_distinct_blocks() {
        let base = BASE + (1 << 40);
        std::thread::scope(|s| {
            for t in 0..4usize {
                s.spawn(move || {
                    for round in 0..200 {
                        let addr = base + (t * 1000 + round) * HUGE_PAGE_2M;
                        register(at(addr), (t + 1) * HUGE_PAGE_2M).unwrap();
                        assert_eq!(mapped_len(addr as *const u8), Some((t + 1) * HUGE_PAGE_2M));
                        assert_eq!(remove(addr as *mut u8), Some((t + 1) * HUGE_PAGE_2M));
                    }
                });
            }
        });
    }
}
