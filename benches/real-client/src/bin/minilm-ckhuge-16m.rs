//! all-MiniLM-L6-v2 under `ckalloc::CkHuge::with_threshold(16 MiB)`: only
//! requests of 16 MiB and more get huge-page mappings (in this program the
//! weights file buffer and the word-embedding table); activations (3 MiB
//! and 12 MiB tensors) go to `System`.

#[global_allocator]
static A: ckalloc::CkHuge = ckalloc::CkHuge::with_threshold(16 << 20);

fn main() -> std::process::ExitCode {
    ckalloc_real_client::main("ckhuge-16m")
}
