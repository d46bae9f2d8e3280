//! Mapping the arena's address range: anonymous mode over the huge-page
//! ladder, and mixed mode (a `PROT_NONE` reservation with the weights file
//! mapped read-only inside it). All OS calls go through `crate::sys`.

use super::ArenaError;
use crate::huge::{self, Backing, HugeOptions};
use crate::sys::{self, HUGE_PAGE_2M};
use std::ptr::NonNull;

/// Where the arena sits inside its mapping.
///
/// The mapping starts `shift` bytes before the arena's offset 0, where
/// `shift < 2 MiB` is a multiple of the page size chosen so that
/// `base + page_floor(activations_base)` is 2 MiB aligned: the runtime region
/// then starts in the first page of an aligned 2 MiB extent and as many of its
/// bytes as possible lie in whole extents, which is all THP can back. `base`
/// stays page aligned, so every offset keeps its alignment up to the page
/// size.
#[derive(Clone, Copy, Debug)]
pub(super) struct Geometry {
    pub total: usize,
    pub weights_base: usize,
    pub activations_base: usize,
    pub page: usize,
    pub shift: usize,
    /// `shift + total` rounded up to 2 MiB: the length of the mapping.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub map_len: usize,
}

impl Geometry {
    pub(super) fn new(
        total: usize,
        weights_base: usize,
        activations_base: usize,
    ) -> Result<Geometry, ArenaError> {
        let page = sys::page_size();
        let ab_floor = activations_base & !(page - 1);
        let shift = (HUGE_PAGE_2M - ab_floor % HUGE_PAGE_2M) % HUGE_PAGE_2M;
        let too_large = ArenaError::TooLarge { total_size: total };
        let map_len = shift
            .checked_add(total)
            .and_then(|n| sys::round_up(n, HUGE_PAGE_2M))
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or(too_large)?;
        Ok(Geometry {
            total,
            weights_base,
            activations_base,
            page,
            shift,
            map_len,
        })
    }

    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    fn page_floor(&self, n: usize) -> usize {
        n & !(self.page - 1)
    }

    /// `n` rounded up to a page, or `n` when that overflows (it then lies
    /// past every page the arena maps, and callers clamp it).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    fn page_ceil(&self, n: usize) -> usize {
        sys::round_up(n, self.page).unwrap_or(n)
    }
}

/// How the mapping is released.
#[derive(Debug)]
enum Kind {
    /// A ladder mapping from `huge::map_huge` (counted in `huge_stats`).
    Huge,
    /// A mixed-mode reservation with fixed mappings inside.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    Reserved,
    /// Heap memory (unit tests under Miri, which cannot `madvise`).
    #[cfg(test)]
    Heap(std::alloc::Layout),
}

/// The arena's memory: released exactly once, on drop.
#[derive(Debug)]
pub(super) struct Storage {
    pub map_ptr: NonNull<u8>,
    pub map_len: usize,
    pub base: NonNull<u8>,
    /// Backing of the runtime region.
    pub backing: Backing,
    /// Page size of the runtime region (2 MiB or 1 GiB for hugetlb), the
    /// granularity of `MADV_DONTNEED`.
    pub page_size: usize,
    kind: Kind,
}

impl Storage {
    /// Bytes mapped from `base` on: at least `total`.
    pub(super) fn mapped_len_from_base(&self) -> usize {
        self.map_len - (self.base.as_ptr() as usize - self.map_ptr.as_ptr() as usize)
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        match self.kind {
            Kind::Huge => huge::unmap(self.map_ptr, self.map_len),
            // Errors cannot be reported from Drop; munmap of a range we own
            // fails only for invalid arguments, which the type rules out.
            Kind::Reserved => {
                let _ = sys::munmap_best_effort(self.map_ptr.as_ptr(), self.map_len);
            }
            #[cfg(test)]
            // SAFETY: allocated in `heap` with this layout.
            Kind::Heap(layout) => unsafe { std::alloc::dealloc(self.map_ptr.as_ptr(), layout) },
        }
    }
}

fn offset_ptr(p: NonNull<u8>, off: usize) -> NonNull<u8> {
    // SAFETY: callers pass offsets inside the mapping, so the result is in
    // bounds of the same allocation and non-null.
    unsafe { NonNull::new_unchecked(p.as_ptr().add(off)) }
}

/// Anonymous mode: the whole range from the huge-page ladder.
pub(super) fn anon(geometry: &Geometry, opts: &HugeOptions) -> Result<Storage, ArenaError> {
    let m =
        huge::map_huge(geometry.shift + geometry.total, HUGE_PAGE_2M, opts).map_err(|source| {
            ArenaError::Anon {
                total_size: geometry.total,
                source,
            }
        })?;
    let storage = Storage {
        map_ptr: m.ptr,
        map_len: m.mapped_len,
        base: offset_ptr(m.ptr, geometry.shift),
        backing: m.backing,
        page_size: m.page_size,
        kind: Kind::Huge,
    };
    check_address_bound(storage, geometry)
}

/// The bump arithmetic relies on `base + total <= isize::MAX` (see
/// `local::bump`); user-space addresses satisfy this on every 64-bit target.
fn check_address_bound(storage: Storage, geometry: &Geometry) -> Result<Storage, ArenaError> {
    let end = (storage.map_ptr.as_ptr() as usize).checked_add(storage.map_len);
    match end {
        Some(e) if e <= isize::MAX as usize => Ok(storage),
        // `storage` drops here and releases the mapping.
        _ => Err(ArenaError::TooLarge {
            total_size: geometry.total,
        }),
    }
}

/// Mixed mode (Linux): reserve `PROT_NONE`, map the whole file pages of the
/// weights read-only over it, open the rest read-write in place, and fill
/// the weights' partial first and last pages with `pread`. On error the
/// reservation is released.
#[cfg(target_os = "linux")]
pub(super) fn mixed(
    geometry: &Geometry,
    fd: &sys::Fd,
    file_size: u64,
    opts: &HugeOptions,
) -> Result<Storage, ArenaError> {
    let map_err = |step, offset, len| {
        move |source| ArenaError::MixedMap {
            step,
            offset,
            len,
            source,
        }
    };
    let has_weights = geometry.activations_base > geometry.weights_base;
    // The prefix (C-Kernel-Engine's) is anonymous and writable up to the
    // first whole page of the weights, so it reads zero as in anon mode,
    // also in the page `weights_base` falls in; whole file pages of the
    // weights region are mapped read-only; everything from the page holding
    // `activations_base` on is anonymous.
    let file_end = geometry.page_floor(geometry.activations_base);
    let file_start = if has_weights {
        geometry.page_ceil(geometry.weights_base).min(file_end)
    } else {
        file_end
    };
    let file_len = file_end - file_start;
    // Whether the file maps at all, asked before the reservation exists: a
    // refusal under `MAP_FIXED` would leave a hole in it
    // (`sys::probe_file_readonly`).
    if file_len > 0 {
        sys::probe_file_readonly(file_len, fd.raw(), file_start as u64)
            .map_err(map_err("weights", file_start, file_len))?;
    }
    let res = sys::reserve_aligned(geometry.map_len, HUGE_PAGE_2M).map_err(|source| {
        ArenaError::MixedMap {
            step: "reserve",
            offset: 0,
            len: geometry.map_len,
            source,
        }
    })?;
    // From here on, dropping `storage` releases the whole reservation, and
    // with it every fixed mapping made inside it.
    let mut storage = Storage {
        map_ptr: res,
        map_len: geometry.map_len,
        base: offset_ptr(res, geometry.shift),
        backing: Backing::Normal,
        page_size: geometry.page,
        kind: Kind::Reserved,
    };
    let base = storage.base;
    if file_start > 0 {
        sys::commit_read_write(base, file_start).map_err(map_err("prefix", 0, file_start))?;
    }
    if file_len > 0 {
        sys::map_file_fixed_readonly(
            offset_ptr(base, file_start),
            file_len,
            fd.raw(),
            file_start as u64,
        )
        .map_err(map_err("weights", file_start, file_len))?;
    }
    let runtime_len = geometry.map_len - geometry.shift - file_end;
    let runtime = offset_ptr(base, file_end);
    // `base + file_end` is 2 MiB aligned and `runtime_len` a multiple of
    // 2 MiB (see `Geometry`), so the runtime region can hold 2 MiB hugetlb pages.
    let hugetlb = opts.required_tier() == Backing::Hugetlb;
    if runtime_len > 0 && hugetlb {
        sys::map_hugetlb_fixed(runtime, runtime_len).map_err(|e| ArenaError::MixedOptions {
            source: huge::HugeError::TierUnavailable {
                requested: runtime_len,
                required: Backing::Hugetlb,
                source: Some(e),
            },
        })?;
        storage.backing = Backing::Hugetlb;
        storage.page_size = HUGE_PAGE_2M;
    } else if runtime_len > 0 {
        sys::commit_read_write(runtime, runtime_len).map_err(map_err(
            "runtime",
            file_end,
            runtime_len,
        ))?;
    }
    let mut thp_err = None;
    if runtime_len > 0 && !hugetlb {
        storage.backing = if !crate::tier::thp_enabled() {
            Backing::Normal
        } else {
            match sys::madvise(runtime.as_ptr(), runtime_len, sys::Advice::HugePage) {
                Ok(()) => Backing::TransparentHuge,
                // A refused hint is a lower tier, not a failure (unless the
                // options require THP, below).
                Err(e) => {
                    thp_err = Some(e);
                    Backing::Normal
                }
            }
        };
    }
    // The runtime region is where the options apply: the file pages are
    // never huge. A required tier it did not get is an error, as in anon
    // mode.
    if storage.backing < opts.required_tier() {
        return Err(ArenaError::MixedOptions {
            source: huge::HugeError::TierUnavailable {
                requested: runtime_len,
                required: opts.required_tier(),
                source: thp_err,
            },
        });
    }
    if runtime_len > 0 {
        huge::apply_options(runtime, runtime_len, HUGE_PAGE_2M, opts)
            .map_err(|source| ArenaError::MixedOptions { source })?;
    }
    // The weights' partial pages, private anonymous: the first (in the
    // prefix's mapping) and the last (in the runtime region's, filled once
    // that region is advised and bound, so that the page the copy faults in
    // can be part of a huge page and follows the NUMA policy). Bytes past
    // the end of the file stay zero.
    if has_weights {
        let wb = geometry.weights_base;
        fill_from_file(base, fd, file_size, wb, file_start.max(wb))?;
        fill_from_file(
            base,
            fd,
            file_size,
            wb.max(file_end),
            geometry.activations_base,
        )?;
    }
    check_address_bound(storage, geometry)
}

/// Read the file's bytes `[from, to)`, those before `file_size`, into the
/// arena at the same offsets, which lie in a read-write anonymous mapping
/// of `base`'s reservation.
#[cfg(target_os = "linux")]
fn fill_from_file(
    base: NonNull<u8>,
    fd: &sys::Fd,
    file_size: u64,
    from: usize,
    to: usize,
) -> Result<(), ArenaError> {
    let to = (to as u64).min(file_size) as usize;
    if to <= from {
        return Ok(());
    }
    // SAFETY: `from..to` lies in a read-write anonymous mapping of the
    // reservation (the caller's), owned by its `Storage`; no other
    // reference to those bytes exists while the arena is being built.
    let buf = unsafe { std::slice::from_raw_parts_mut(base.as_ptr().add(from), to - from) };
    sys::pread_exact(fd, buf, from as u64).map_err(|source| ArenaError::ReadWeights {
        offset: from as u64,
        len: to - from,
        source,
    })
}

#[cfg(not(target_os = "linux"))]
pub(super) fn mixed(
    _plan: &Geometry,
    _fd: &sys::Fd,
    _file_size: u64,
    _opts: &HugeOptions,
) -> Result<Storage, ArenaError> {
    Err(ArenaError::MixedUnsupported)
}

/// Heap-backed storage for unit tests (Miri cannot run `madvise`).
#[cfg(test)]
pub(super) fn heap(geometry: &Geometry) -> Storage {
    let layout = std::alloc::Layout::from_size_align(geometry.map_len, geometry.page).unwrap();
    // SAFETY: non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    let p = NonNull::new(p).expect("test allocation");
    Storage {
        map_ptr: p,
        map_len: geometry.map_len,
        base: offset_ptr(p, geometry.shift),
        backing: Backing::Normal,
        page_size: geometry.page,
        kind: Kind::Heap(layout),
    }
}
