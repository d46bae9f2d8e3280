//! What every allocator of the crate (`&BumpArena`, `&LocalArena`, `CkHuge`,
//! `CachingAllocator` over `CkHuge` and over an arena) does alike through
//! `allocator_api2::alloc::Allocator`:
//!
//! - `zero_size`: a zero-size request of any alignment succeeds with a
//!   dangling, aligned pointer, also from a full arena.
//! - `zeroed`: `allocate_zeroed` and `grow_zeroed` read zero, also over the
//!   bytes of a freed or shrunk block.

mod zero_size;
mod zeroed;
