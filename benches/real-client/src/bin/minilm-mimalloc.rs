//! all-MiniLM-L6-v2 under mimalloc.

#[global_allocator]
static A: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    ckalloc_real_client::main("mimalloc")
}
