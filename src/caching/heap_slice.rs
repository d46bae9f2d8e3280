//! [`HeapSlice`]: a heap slice with a stable address, shared with the
//! fork handlers' registry.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A boxed slice owned through a raw pointer: the registry keeps pointers to
/// an instance's pools and table shards while the instance moves, and a
/// moved `Box` would assert unique access to its contents (invalidating
/// those pointers under Rust's aliasing rules); a raw pointer asserts
/// nothing. Derefs to the slice like the `Box` it was made from, and frees
/// it on drop.
pub(crate) struct HeapSlice<T>(pub(super) NonNull<[T]>);

// SAFETY: owns its elements, as `Box<[T]>` does.
unsafe impl<T: Send> Send for HeapSlice<T> {}
// SAFETY: `&HeapSlice<T>` gives only `&[T]`, as `&Box<[T]>` does.
unsafe impl<T: Sync> Sync for HeapSlice<T> {}

impl<T> HeapSlice<T> {
    pub(crate) fn new(b: Box<[T]>) -> HeapSlice<T> {
        HeapSlice(NonNull::from(Box::leak(b)))
    }
}

impl<T> Deref for HeapSlice<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: the slice lives until `drop`; shared access only (plus the
        // registry's, which only uses the elements' locks).
        unsafe { self.0.as_ref() }
    }
}

impl<T> DerefMut for HeapSlice<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: `&mut self` is exclusive; the owner unregisters before it
        // uses this (`BlockTable`'s drop runs after the registration's).
        unsafe { self.0.as_mut() }
    }
}

impl<T> Drop for HeapSlice<T> {
    fn drop(&mut self) {
        // SAFETY: made by `Box::leak` in `new`; no other pointer is used
        // afterwards (the owner unregistered first).
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}
