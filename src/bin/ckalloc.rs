//! The `ckalloc` command-line tool (feature `cli`).

fn main() {
    eprintln!("ckalloc: the command-line tool is not built yet");
    std::process::exit(2);
}
