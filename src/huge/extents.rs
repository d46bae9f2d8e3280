//! The extent map: the [`Descriptor`] of every live block, found from its
//! address alone (an alignment test and two loads, touching no memory at
//! the pointer), after tcmalloc's page map: a root of [`ROOT_LEN`] leaf
//! pointers over the 2 MiB addresses below 2^47, leaves of [`LEAF_LEN`]
//! words mapped when a span reaching into them is reserved
//! ([`ExtentMap::prepare`]; never when a block is placed in a span that
//! exists), and never unmapped. Insert and remove are one atomic operation on a word:
//! lock-free, allocation-free, nothing to repair after `fork()`.

use super::os;
use super::stats::Counters;
use crate::sys::{self, Prot, HUGE_PAGE_2M};
use crate::tier::Backing;
use std::ptr::{self, NonNull};
use std::sync::atomic::{
    AtomicPtr, AtomicU64,
    Ordering::{AcqRel, Acquire, Release},
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

/// What the engine knows of a live block: its length, the bytes of its
/// request in its last 2 MiB (its tail), its span and its tier. A block's
/// pages are its span's units; the state of free units (retained or
/// purged, and since when) is in the span's bitmaps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Descriptor {
    /// Length in 2 MiB granules (below 2^26: the address space is 2^47).
    pub(crate) granules: u32,
    /// `size % 2 MiB` of the request (0: it ends on a 2 MiB boundary).
    pub(crate) tail: u32,
    /// The span's slot.
    pub(crate) span: u16,
    pub(crate) tier: Backing,
}

const GRANULE_BITS: u32 = 26;
const TAIL_BITS: u32 = 21;
const SPAN_BITS: u32 = 13;

impl Descriptor {
    /// The descriptor of a block of `len` bytes (a multiple of 2 MiB) for
    /// a request of `size` bytes.
    pub(crate) fn new(len: usize, size: usize, span: u16, tier: Backing) -> Descriptor {
        Descriptor {
            granules: (len / HUGE_PAGE_2M) as u32,
            tail: (size % HUGE_PAGE_2M) as u32,
            span,
            tier,
        }
    }

    /// The block's length in bytes.
    pub(crate) fn len(self) -> usize {
        (self.granules as usize) * HUGE_PAGE_2M
    }

    /// The request's size as far as the descriptor tells: the length, less
    /// what the last 2 MiB does not hold.
    pub(crate) fn size(self) -> usize {
        if self.tail == 0 {
            self.len()
        } else {
            self.len() - HUGE_PAGE_2M + self.tail as usize
        }
    }

    /// Whether the request ends within the first 1 MiB of the block's last
    /// 2 MiB (a short tail: a huge page there would be mostly unused).
    pub(crate) fn short_tail(self) -> bool {
        self.tail != 0 && (self.tail as usize) < HUGE_PAGE_2M / 2
    }

    fn encode(self) -> u64 {
        // Tier code + 1: a word of 0 holds no block.
        let tier = self.tier.code() + 1;
        u64::from(self.granules)
            | u64::from(self.tail) << GRANULE_BITS
            | u64::from(self.span) << (GRANULE_BITS + TAIL_BITS)
            | tier << (GRANULE_BITS + TAIL_BITS + SPAN_BITS)
    }

    fn decode(w: u64) -> Option<Descriptor> {
        let field = |shift: u32, bits: u32| (w >> shift) & ((1 << bits) - 1);
        let tier =
            Backing::from_code(field(GRANULE_BITS + TAIL_BITS + SPAN_BITS, 2).checked_sub(1)?)?;
        Some(Descriptor {
            granules: field(0, GRANULE_BITS) as u32,
            tail: field(GRANULE_BITS, TAIL_BITS) as u32,
            span: field(GRANULE_BITS + TAIL_BITS, SPAN_BITS) as u16,
            tier,
        })
    }
}

struct Leaf {
    words: [AtomicU64; LEAF_LEN],
}

/// The radix map (see the [module docs](self)).
pub(crate) struct ExtentMap {
    root: [AtomicPtr<Leaf>; ROOT_LEN],
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

impl ExtentMap {
    pub(crate) const fn new() -> ExtentMap {
        ExtentMap {
            root: [const { AtomicPtr::new(ptr::null_mut()) }; ROOT_LEN],
        }
    }

    /// The word of `addr`, `None` when its leaf was never mapped.
    #[inline]
    fn word(&self, addr: usize) -> Option<&AtomicU64> {
        let (r, i) = key(addr)?;
        let leaf = self.root[r].load(Acquire);
        // SAFETY: a non-null root entry points to a leaf mapped read-write
        // and never unmapped (zero-filled memory is a valid array of
        // atomics).
        let leaf = unsafe { leaf.as_ref() }?;
        Some(&leaf.words[i])
    }

    /// Map the leaves that cover `base..base + len` (2 MiB aligned, below
    /// 2^47), so that blocks there can be inserted without a system call.
    /// `false` when an address lies beyond the map or a leaf cannot be
    /// mapped (`ENOMEM`).
    pub(crate) fn prepare(&self, c: &Counters, base: usize, len: usize) -> bool {
        let Some(last) = base.checked_add(len - 1) else {
            return false;
        };
        let (Some((first, _)), Some((end, _))) = (key(base), key(last & !(HUGE_PAGE_2M - 1)))
        else {
            return false;
        };
        (first..=end).all(|r| !self.root[r].load(Acquire).is_null() || self.map_leaf(c, r))
    }

    /// Map a leaf for root entry `r` and publish it, unless another thread
    /// published one first.
    #[cold]
    fn map_leaf(&self, c: &Counters, r: usize) -> bool {
        let len = std::mem::size_of::<Leaf>();
        let Ok(fresh) = os::map_aligned(c, len, sys::page_size(), Prot::ReadWrite) else {
            return false;
        };
        let fresh = fresh.cast::<Leaf>();
        if self.root[r]
            .compare_exchange(ptr::null_mut(), fresh.as_ptr(), AcqRel, Acquire)
            .is_err()
        {
            // Another thread published its leaf first: use it, drop ours.
            let _ = os::unmap(c, fresh.cast(), len);
        }
        true
    }

    /// Record the block `d` at `ptr`; `false` when its leaf is not mapped
    /// (the span was not [prepared](Self::prepare)) or a block is there.
    pub(crate) fn insert(&self, ptr: NonNull<u8>, d: Descriptor) -> bool {
        self.word(ptr.as_ptr() as usize)
            .is_some_and(|w| w.compare_exchange(0, d.encode(), Release, Acquire).is_ok())
    }

    /// Replace the descriptor of the live block at `ptr` (its owner resized
    /// it in place).
    pub(crate) fn update(&self, ptr: NonNull<u8>, d: Descriptor) {
        if let Some(w) = self.word(ptr.as_ptr() as usize) {
            w.store(d.encode(), Release);
        }
    }

    /// The descriptor of the block at `ptr`, removed from the map; `None`
    /// when no block starts at `ptr`. Of two racing removals of one block,
    /// one gets it.
    pub(crate) fn remove(&self, ptr: *mut u8) -> Option<Descriptor> {
        Descriptor::decode(self.word(ptr as usize)?.swap(0, AcqRel))
    }

    /// The descriptor of the block at `ptr`, `None` when no block starts
    /// there. Two loads; touches no memory at `ptr`.
    #[inline]
    pub(crate) fn lookup(&self, ptr: *const u8) -> Option<Descriptor> {
        Descriptor::decode(self.word(ptr as usize)?.load(Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Far from anything mapped: only the map's words are touched.
    const BASE: usize = 0x5000_0000_0000;

    fn at(addr: usize) -> NonNull<u8> {
        NonNull::new(addr as *mut u8).unwrap()
    }

    #[test]
    #[cfg_attr(miri, ignore = "mmap of the leaves")]
    fn a_block_is_found_by_its_address_and_removed_once() {
        static MAP: ExtentMap = ExtentMap::new();
        let c = Counters::new();
        let d = Descriptor::new(6 << 21, (5 << 21) + 7, 2047, Backing::Hugetlb);
        assert_eq!(d.size(), (5 << 21) + 7);
        assert!(!MAP.insert(at(BASE), d), "no leaf before prepare");
        assert!(MAP.prepare(&c, BASE, 10 << 30), "two leaves");
        assert!(MAP.insert(at(BASE), d));
        assert_eq!(MAP.lookup(at(BASE).as_ptr()), Some(d));
        assert!(!MAP.insert(at(BASE), d), "taken");
        assert_eq!(MAP.remove(at(BASE).as_ptr()), Some(d));
        assert_eq!(MAP.remove(at(BASE).as_ptr()), None, "a second free");
        // The second leaf, and addresses the map cannot hold.
        let far = BASE + (9 << 30);
        let one = Descriptor::new(HUGE_PAGE_2M, 0, 0, Backing::Normal);
        assert!(MAP.insert(at(far), one));
        assert_eq!(MAP.lookup((far + 4096) as *const u8), None);
        assert_eq!(MAP.lookup((1usize << 47) as *const u8), None);
        assert!(!MAP.prepare(&c, (1 << 47) - HUGE_PAGE_2M, 4 * HUGE_PAGE_2M));
        assert_eq!(MAP.remove(far as *mut u8), Some(one));
    }

    #[test]
    fn descriptors_round_trip_at_their_limits() {
        let max = ((1 << 26) - 1) * HUGE_PAGE_2M;
        for d in [
            Descriptor::new(HUGE_PAGE_2M, 1, 0, Backing::Normal),
            Descriptor::new(max, HUGE_PAGE_2M - 1, 2047, Backing::TransparentHuge),
        ] {
            assert_eq!(Descriptor::decode(d.encode()), Some(d));
        }
        assert_eq!(Descriptor::decode(0), None);
    }
}
