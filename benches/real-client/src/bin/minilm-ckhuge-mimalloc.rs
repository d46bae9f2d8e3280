//! all-MiniLM-L6-v2 under `ckalloc::CkHuge<mimalloc::MiMalloc>`: requests of
//! 2 MiB and more get huge-page mappings (with `CkHuge`'s retention cache),
//! smaller ones go to mimalloc instead of glibc.

#[global_allocator]
static A: ckalloc::CkHuge<mimalloc::MiMalloc> =
    ckalloc::CkHuge::with_small_allocator(mimalloc::MiMalloc);

fn main() -> std::process::ExitCode {
    ckalloc_real_client::main("ckhuge-mimalloc")
}
