//! A caching allocator configured with an IREE spec string: repeated
//! same-sized buffers are served from the cache, and the statistics say so.
//!
//! Run: `cargo run --release --example caching`

use allocator_api2::vec::Vec;
use ckalloc::caching::CachingAllocator;
use ckalloc::CkHuge;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Pool 0: blocks up to 64 MiB, at most 1 GiB live + cached, 8 kept free.
    // Pool 1: anything larger, one block kept.
    let spec = "*=64mib;1gib;8,*=*;*;1";
    let cache = CachingAllocator::from_spec(CkHuge::new(), spec)?;
    println!("spec: {spec}");

    // A decode loop: the same scratch shapes every step.
    for step in 0..10 {
        let mut hidden: Vec<f32, _> = Vec::with_capacity_in(1 << 20, &cache); // 4 MiB
        hidden.resize(1 << 20, step as f32);
        let mut logits: Vec<f32, _> = Vec::with_capacity_in(8 << 20, &cache); // 32 MiB
        logits.resize(8 << 20, 0.5);
        assert_eq!(hidden[12345], step as f32);
    } // both buffers go back to their pool's free list here

    let stats = cache.stats();
    assert_eq!(stats.misses, 2, "the first step allocates, the others hit");
    assert_eq!(stats.hits, 18);
    println!("{stats}");

    // Give the cached blocks back to the inner allocator (munmap).
    cache.trim();
    println!("after trim: {} bytes cached", cache.stats().cached_bytes);
    Ok(())
}
