//! Caching allocator (IREE HAL caching allocator semantics).
