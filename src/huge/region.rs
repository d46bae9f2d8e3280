//! [`HugeRegion`]: an owned huge-page mapping, unmapped on drop.

use super::engine::{map_huge, unmap};
use super::error::HugeError;
use super::ladder::Mapping;
use super::options::HugeOptions;
use crate::probe::{huge_page_coverage, HugeCoverage};
use crate::sys::HUGE_PAGE_2M;
use crate::tier::Backing;
use std::fmt;
use std::ptr::NonNull;

/// An owned, zero-filled, huge-page backed memory region (RAII: `Drop`
/// unmaps it).
///
/// The mapping is at least 2 MiB aligned and covers `len()` rounded up to the
/// page size of its tier (`mapped_len()`). `HugeRegion` is `Send + Sync`: it is
/// plain memory; shared access goes through `&[u8]`, mutation through
/// `&mut self`.
///
/// ```
/// use ckalloc::HugeRegion;
/// let mut r = HugeRegion::new(3 << 20).unwrap();
/// assert_eq!(r.len(), 3 << 20);
/// assert_eq!(r.mapped_len(), 4 << 20);
/// r.as_mut_slice()[0] = 7;
/// assert_eq!(r.as_slice()[0], 7);
/// println!("backed by {}", r.backing());
/// ```
pub struct HugeRegion {
    ptr: NonNull<u8>,
    len: usize,
    mapped_len: usize,
    backing: Backing,
    page_size: usize,
}

// SAFETY: the region owns its mapping exclusively; the raw pointer is not
// shared with anything else, so moving it across threads is sound.
unsafe impl Send for HugeRegion {}
// SAFETY: `&HugeRegion` only hands out `&[u8]` (shared reads); writes need
// `&mut HugeRegion`.
unsafe impl Sync for HugeRegion {}

impl HugeRegion {
    /// Map `bytes` of zeroed memory with the default options (hugetlb, then
    /// THP, then normal pages).
    ///
    /// # Errors
    /// [`HugeError::ZeroSize`] for 0, [`HugeError::TooLarge`] when rounding up
    /// overflows or exceeds `isize::MAX`, [`HugeError::Map`] when the kernel
    /// refuses the mapping.
    pub fn new(bytes: usize) -> Result<HugeRegion, HugeError> {
        Self::with_options(bytes, &HugeOptions::new())
    }

    /// Map `bytes` of zeroed memory with `opts`.
    ///
    /// # Errors
    /// As [`HugeRegion::new`], plus [`HugeError::TierUnavailable`],
    /// [`HugeError::Mbind`], [`HugeError::Populate`] and [`HugeError::Mlock`]
    /// for the options that ask for them. Nothing stays mapped on error.
    pub fn with_options(bytes: usize, opts: &HugeOptions) -> Result<HugeRegion, HugeError> {
        Self::with_alignment(bytes, HUGE_PAGE_2M, opts)
    }

    /// Like [`with_options`](Self::with_options), with the start aligned to
    /// `align` bytes (a power of two; at least 2 MiB is always given).
    pub fn with_alignment(
        bytes: usize,
        align: usize,
        opts: &HugeOptions,
    ) -> Result<HugeRegion, HugeError> {
        let Mapping {
            ptr,
            mapped_len,
            backing,
            page_size,
        } = map_huge(bytes, align, opts)?;
        Ok(HugeRegion {
            ptr,
            len: bytes,
            mapped_len,
            backing,
            page_size,
        })
    }

    /// The start of the region.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The start of the region, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The requested size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a region holds at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Bytes actually mapped: `len()` rounded up to the page size of the tier
    /// (2 MiB, or 1 GiB for 1 GiB hugetlb pages).
    pub fn mapped_len(&self) -> usize {
        self.mapped_len
    }

    /// Which tier backs the region.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// The page size of the backing in bytes: 2 MiB or 1 GiB for hugetlb, the
    /// base page size otherwise (THP extents are 2 MiB when the kernel
    /// provides them; see [`coverage`](Self::coverage)).
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// The first `len()` bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is readable and writable for mapped_len >= len
        // bytes, initialised (zero-filled by the kernel) and owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The first `len()` bytes, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// How much of the first `len()` bytes is resident and how much of that
    /// is in huge pages (see [`huge_page_coverage`]).
    pub fn coverage(&self) -> std::io::Result<HugeCoverage> {
        huge_page_coverage(self.as_ptr(), self.len)
    }
}

impl Drop for HugeRegion {
    fn drop(&mut self) {
        unmap(self.ptr, self.mapped_len);
    }
}

impl fmt::Debug for HugeRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HugeRegion")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("mapped_len", &self.mapped_len)
            .field("backing", &self.backing)
            .finish()
    }
}
