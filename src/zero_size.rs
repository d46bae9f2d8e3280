//! The block of a zero-size request, from every allocator of the crate: a
//! dangling pointer aligned as asked, never dereferenced and never freed
//! ([`empty_block`]). A zero-size request of any alignment never fails.

use std::ptr::NonNull;

/// An empty block at the address `align` (a non-zero power of two, so the
/// pointer is non-null and aligned); no memory is behind it. Cold: a
/// zero-size request is rare, and keeping this out of line keeps the
/// allocators' hot paths as they are.
#[cold]
pub(crate) fn empty_block(align: usize) -> NonNull<[u8]> {
    let p = std::ptr::without_provenance_mut::<u8>(align);
    // SAFETY: `align` is non-zero (every `Layout` alignment is), so `p` is
    // non-null; it is never dereferenced (zero bytes).
    NonNull::slice_from_raw_parts(unsafe { NonNull::new_unchecked(p) }, 0)
}
