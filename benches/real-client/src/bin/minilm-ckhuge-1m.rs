//! all-MiniLM-L6-v2 under `ckalloc::CkHuge::with_threshold(1 MiB)`: requests
//! of 1 MiB and more get huge-page mappings (2 MiB-rounded), smaller ones go
//! to `System`.

#[global_allocator]
static A: ckalloc::CkHuge = ckalloc::CkHuge::with_threshold(1 << 20);

fn main() -> std::process::ExitCode {
    ckalloc_real_client::main("ckhuge-1m")
}
