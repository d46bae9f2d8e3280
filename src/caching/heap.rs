//! Heaps, heap keys and the [`DeclareHeap`] trait (IREE's
//! `iree_hal_allocator_memory_heap_t` and its heap selection rule).

use std::fmt;

use super::flags::{BufferUsage, MemoryType};

/// The memory heap an inner allocator serves (`iree_hal_allocator_memory_heap_t`).
///
/// The default, [`Heap::host`], is what IREE's CPU devices report for their
/// single heap, widened to name what host memory is: ordinary host memory
/// (`host_local`, `host_cached`) that CPU "device" code uses directly
/// (`device_local`), allowing every buffer usage. An inner allocator with a
/// narrower heap declares it through [`DeclareHeap`] or the builder's
/// [`heap`](crate::caching::CachingBuilder::heap).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Heap {
    /// A short human-readable name used in errors and summaries.
    pub name: &'static str,
    /// Memory type bits the heap's memory has.
    pub memory_type: MemoryType,
    /// Buffer usages the heap allows.
    pub allowed_usage: BufferUsage,
    /// Largest single allocation in bytes the heap can serve.
    pub max_allocation_size: u64,
}

impl Heap {
    /// Host memory satisfying both the host and the device memory types, with
    /// every usage allowed and `isize::MAX` bytes as the allocation limit.
    pub const fn host() -> Heap {
        Heap {
            name: "host",
            memory_type: MemoryType::HOST_LOCAL
                .union(MemoryType::HOST_CACHED)
                .union(MemoryType::DEVICE_LOCAL),
            allowed_usage: BufferUsage::ALL,
            max_allocation_size: isize::MAX as u64,
        }
    }

    /// True if this heap satisfies `key` (IREE's `iree_hal_select_heap` rule:
    /// all requested memory type bits and usage bits are present). The
    /// `optimal` bit is an allocation-time hint and is satisfied by every heap.
    pub fn satisfies(&self, key: &HeapKey) -> bool {
        let wanted = key.memory_type.difference(MemoryType::OPTIMAL);
        self.memory_type.contains(wanted) && self.allowed_usage.contains(key.buffer_usage)
    }
}

impl Default for Heap {
    fn default() -> Heap {
        Heap::host()
    }
}

impl fmt::Display for Heap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (memory types {}; usage {})",
            self.name, self.memory_type, self.allowed_usage
        )
    }
}

/// Lets an inner allocator declare the heap it serves.
///
/// The caching allocator uses the declared heap to check each pool's heap key
/// ([`SpecErrorKind::NoMatchingHeap`](super::SpecErrorKind::NoMatchingHeap)) and as the source of the default
/// per-pool size limit. The default method returns [`Heap::host`].
pub trait DeclareHeap {
    /// The heap this allocator's memory comes from.
    fn heap(&self) -> Heap {
        Heap::host()
    }
}

impl DeclareHeap for allocator_api2::alloc::Global {}
impl<T: DeclareHeap + ?Sized> DeclareHeap for &T {
    fn heap(&self) -> Heap {
        (**self).heap()
    }
}

/// The heap selector on the left of `=`: `memory_type[;buffer_usage]`.
/// Empty sets are wildcards (`*`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct HeapKey {
    /// Required memory type bits (`*` = none required).
    pub memory_type: MemoryType,
    /// Required buffer usage bits (`*` = none required).
    pub buffer_usage: BufferUsage,
}

impl fmt::Display for HeapKey {
    /// Canonical: `memory_type` alone when the usage is `*`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.memory_type)?;
        if !self.buffer_usage.is_empty() {
            write!(f, ";{}", self.buffer_usage)?;
        }
        Ok(())
    }
}
