//! all-MiniLM-L6-v2 under `ckalloc::CkHuge::new()` (requests of 2 MiB and
//! more get huge-page mappings, smaller ones go to `System`).

#[global_allocator]
static A: ckalloc::CkHuge = ckalloc::CkHuge::new();

fn main() -> std::process::ExitCode {
    ckalloc_real_client::main("ckhuge")
}
