//! [`PoolParams`] and [`RoundUp`]: what one pool keeps and how it rounds
//! request sizes.

use super::heap::Heap;

/// IREE's default `max_free_allocation_count`.
pub const DEFAULT_MAX_FREE_ALLOCATION_COUNT: u32 = 64;

/// Parameters of one pool (`iree_hal_caching_allocator_pool_params_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolParams {
    /// The heap the pool's memory comes from; its memory types and usages
    /// must be satisfied by the inner allocator's heap.
    pub heap: Heap,
    /// Largest request in bytes the pool takes; larger requests go to a later
    /// pool or, if none takes them, straight to the inner allocator.
    pub max_allocation_size: u64,
    /// Most bytes (live + cached, as allocated from the inner allocator) the
    /// pool holds; beyond it requests are served unpooled. `u64::MAX` = unlimited.
    pub max_allocation_capacity: u64,
    /// Most blocks the pool's free lists keep.
    pub max_free_allocation_count: u32,
}

impl PoolParams {
    /// IREE's defaults for `heap`: size limit the heap's maximum, capacity
    /// unlimited, free count 64.
    pub fn new(heap: Heap) -> PoolParams {
        PoolParams {
            heap,
            max_allocation_size: heap.max_allocation_size,
            max_allocation_capacity: u64::MAX,
            max_free_allocation_count: DEFAULT_MAX_FREE_ALLOCATION_COUNT,
        }
    }
}

/// Size rounding applied inside a pool before looking for a cached block.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RoundUp {
    /// Exact sizes (IREE's behaviour).
    #[default]
    None,
    /// PyTorch's `roundup_power2_divisions`: the range between two powers of
    /// two is split into `n` equal steps and sizes round up to the next step
    /// (`n = 1` rounds to the next power of two). `n` must be a power of two
    /// in `1..=65536`; powers of two are never rounded. Where a step would be
    /// under one byte (a size below `n`), the size rounds up to the next
    /// power of two, as PyTorch's `roundup_power2_next_division` does: with
    /// `n = 65536`, 1025 becomes 2048.
    PowerOfTwoDivisions(u32),
}

impl RoundUp {
    pub(super) fn is_valid(self) -> bool {
        match self {
            RoundUp::None => true,
            RoundUp::PowerOfTwoDivisions(n) => n.is_power_of_two() && n <= 1 << 16,
        }
    }

    /// The rounded size in bytes; `size` itself if rounding would overflow.
    pub fn apply(self, size: usize) -> usize {
        match self {
            RoundUp::None => size,
            RoundUp::PowerOfTwoDivisions(n) => {
                if size <= 1 || size.is_power_of_two() {
                    return size;
                }
                let floor = 1usize << (usize::BITS - 1 - size.leading_zeros());
                let step = floor >> n.trailing_zeros();
                if step == 0 {
                    return floor.checked_mul(2).unwrap_or(size);
                }
                let down = size & !(step - 1);
                if down == size {
                    size
                } else {
                    down.checked_add(step).unwrap_or(size)
                }
            }
        }
    }
}
