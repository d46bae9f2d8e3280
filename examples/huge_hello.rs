//! Allocate through `CkHuge` (as global allocator and directly) and print
//! which tier served each request.
//!
//! Run: `cargo run --release --example huge_hello`

use ckalloc::{huge_stats, probe, CkHuge, HugeOptions, HugeRegion};

#[global_allocator]
static A: CkHuge = CkHuge::new();

fn main() {
    println!("== system\n{}\n", probe());
    let mut v = vec![0u8; 256 << 20];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    let cov = ckalloc::huge_page_coverage(v.as_ptr(), v.len()).expect("coverage");
    println!("Vec<u8> of 256 MiB through CkHuge: {cov}");
    drop(v);

    for bytes in [3usize << 20, 64 << 20] {
        match HugeRegion::with_options(bytes, &HugeOptions::new().populate(true)) {
            Ok(r) => println!(
                "HugeRegion {} bytes: {} (mapped {} bytes), {}",
                r.len(),
                r.backing(),
                r.mapped_len(),
                r.coverage().expect("coverage")
            ),
            Err(e) => println!("HugeRegion {bytes} bytes failed: {e}"),
        }
    }
    println!("\n== huge-page counters\n{}", huge_stats());
}
