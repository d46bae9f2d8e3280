//! Resizing a block of the engine ([`Engine::resize`]): in place when the
//! length stays, when it shrinks, or when the units after the block are
//! free; else the block moves ([`relocate`]).

use super::engine::{block_len, Ask, Block, Engine, Fill, ResizeError};
use super::extents::Descriptor;
use super::os;
use super::policy::Policy;
use super::relocate::{relocate, Moved};
use super::retain::{self, Restore};
use super::span::Units;
use super::stats::Count;
use crate::sys::{self, Advice};
use crate::tier::Backing;
use std::ptr::{self, NonNull};

impl Engine {
    /// Resize the block at `p` to `new_size` bytes, keeping `align` and the
    /// contents up to the smaller size: in place when the length stays,
    /// shrinks (never fails) or the units after it are free; else moved
    /// ([`relocate`]). For `Fill::Zeroed` the bytes past the old size read
    /// zero: past `old_size`, the caller's (an `Allocator` caller owns the
    /// whole block and may name any size up to its length), or past the
    /// block's request when that is larger. On error the block is as it
    /// was.
    ///
    /// # Safety
    /// A block at `p` is the caller's, and no reference into it outlives a
    /// move.
    pub(crate) unsafe fn resize(
        &self,
        p: *mut u8,
        old_size: usize,
        new_size: usize,
        align: usize,
        fill: Fill,
        policy: &Policy,
    ) -> Result<Block, ResizeError> {
        let d = self.extents.lookup(p).ok_or(ResizeError::NotOurs)?;
        let Units { span, v, start, n } = self.units_of(p, d).ok_or(ResizeError::NotOurs)?;
        let new_len = block_len(new_size, align).ok_or(ResizeError::NoMemory)?;
        self.tick();
        let ptr = v.addr(start);
        let old_len = v.len(n);
        let old_size = old_size.max(d.size()).min(old_len);
        // Units of this span the new length takes; 0 when a growth must
        // move (beyond the span, or into a span of longer units).
        let m = v.units_for(new_len);
        let m = if new_len > old_len && (start + m > v.units || !v.serves(new_len)) {
            0
        } else {
            m
        };
        let zero_to = |to: usize| {
            if fill == Fill::Zeroed && to > old_size {
                self.writable(ptr, old_size, to);
                // SAFETY: `old_size..to` lies inside the caller's block,
                // read-write now.
                unsafe { ptr::write_bytes(ptr.as_ptr().add(old_size), 0, to - old_size) };
            }
        };
        let descriptor = |units: u32| Descriptor::new(v.len(units), new_size, v.index, v.tier);
        if m == n {
            zero_to(new_size.min(old_len));
            self.extents.update(ptr, descriptor(n));
            return Ok(Block { ptr, len: old_len });
        }
        if m != 0 && m < n {
            self.extents.update(ptr, descriptor(m));
            self.stats.sub(Count::Live, v.len(n - m) as u64);
            self.give_back(&span.units(v, start + m, n - m), policy, Restore::Access);
            return Ok(Block { ptr, len: v.len(m) });
        }
        // Grown in place: the units after the block, claimed and made ready
        // (in a span advised `MADV_HUGEPAGE` while the background thread
        // promotes, only if the fault check grants it: else it moves).
        if m > n
            && self.may_fault_in(span, &v, v.len(m - n))
            && span.claim(&v, start + n, m - n)
            && self.ready(&span.units(v, start + n, m - n), fill, v.len(m - n), policy)
        {
            zero_to(old_len);
            // The old last unit is a tail no more: advised for THP again.
            let last = start + n - 1;
            if span.tails.count(last, 1) != 0 {
                let _ = os::advise(&self.stats, v.addr(last), v.len(1), Advice::HugePage);
                span.forget_advice(&self.stats, last, 1);
            }
            if descriptor(m).short_tail() {
                self.keep_tail_out(span, &v, start + m - 1);
            }
            self.extents.update(ptr, descriptor(m));
            self.live_grew(crate::sys::monotonic_ns(), v.len(m - n));
            self.stats.add(Count::GrownInPlace, 1);
            self.advise_growth(&span.units(v, start + n, m - n), policy);
            return Ok(Block { ptr, len: v.len(m) });
        }
        // Moved: the new place is fresh or retained units; the moved bytes
        // replace what they held.
        let ask = Ask {
            replaces: old_len,
            ..Ask::new(new_size, new_len, align, fill, policy)
        };
        let c = self.claim(&ask).ok_or(ResizeError::NoMemory)?;
        let dst = c.units();
        // The pages move onto a destination that reads zero (what a move
        // that fails midway needs): retained units there are purged first.
        // Between spans advised differently they are copied: `mremap` gives
        // the destination the source's `MADV_HUGEPAGE` or its absence, which
        // would outlive the block on units whose span says otherwise.
        let head = dst.v.units_for(old_len).min(dst.n);
        let pages = v.tier != Backing::Hugetlb
            && dst.v.tier != Backing::Hugetlb
            && span.advised() == dst.span.advised()
            && self.purge_dirty(&dst.at(dst.start, head));
        let dst = dst.addr();
        let moved = relocate(&self.stats, ptr, dst, old_len, 1 << v.shift, pages);
        let count = match moved {
            Moved::Pages => Count::Moved,
            Moved::Copied => Count::Copied,
        };
        self.stats.add(count, 1);
        if fill == Fill::Zeroed && old_size < old_len {
            self.writable(dst, old_size, old_len);
            // SAFETY: the new block holds `new_len > old_len` bytes, and
            // `old_size..old_len` is read-write now; its units past the old
            // length were cleared when claimed.
            unsafe { ptr::write_bytes(dst.as_ptr().add(old_size), 0, old_len - old_size) };
        }
        self.extents.remove(p);
        self.stats.sub(Count::Live, old_len as u64);
        // The old units are purged and made plain memory, never retained as
        // they are: what the program did to the block went with it.
        let old = span.units(v, start, n);
        retain::give(&self.stats, &self.spans, &old, false, Restore::Everything);
        let added = c.units().at(c.p.start + head, c.p.n - head);
        let b = self.hand_out(c, new_size, policy, false);
        self.advise_growth(&added, policy);
        Ok(b)
    }

    /// Make bytes `from..to` of the block at `p` read-write to write them.
    fn writable(&self, p: NonNull<u8>, from: usize, to: usize) {
        let start = from & !(sys::page_size() - 1);
        if let Some(at) = NonNull::new(p.as_ptr().wrapping_add(start)) {
            let _ = os::commit(&self.stats, at, to - start);
        }
    }

    /// Purge the dirty units among `u`; `false` on failure.
    fn purge_dirty(&self, u: &Units<'_>) -> bool {
        u.span
            .dirty_runs(u.start, u.n)
            .all(|(s, e)| retain::purge(&self.stats, &u.at(s, e - s), Restore::Access))
    }

    /// Units just added to a block go to base pages, as fresh blocks do,
    /// while the first-touch window after a slow page is open.
    fn advise_growth(&self, u: &Units<'_>, policy: &Policy) {
        let thp = u.v.tier == Backing::TransparentHuge && u.span.advised() && policy.probes();
        if u.n > 0
            && thp
            && self
                .window
                .base_pages_if_open(&self.stats, u.addr(), u.len())
        {
            u.span.base_pages.set(u.start, u.n);
        }
    }
}
