//! all-MiniLM-L6-v2 under glibc's malloc (`std::alloc::System`).

#[global_allocator]
static A: std::alloc::System = std::alloc::System;

fn main() -> std::process::ExitCode {
    ckalloc_real_client::main("system")
}
