//! The `CKALLOC_*` variables checked once before the program starts: each
//! value the library will not take, with what it uses instead, and each
//! name no part of ckalloc reads. The library itself says nothing about
//! them (it never writes to a stream the program did not ask for).

use ckalloc::env::{settings, stats_file_template, Source};

/// The `CKALLOC_*` variables read outside [`settings`]: the summary's file,
/// `ckalloc run`'s library and the model cache of the CLI.
const OTHER_NAMES: [&str; 3] = [
    "CKALLOC_STATS_FILE",
    "CKALLOC_PRELOAD_LIB",
    "CKALLOC_MODEL_CACHE",
];

/// One line per `CKALLOC_*` variable of this process's environment that is
/// not taken as written, in the environment's order.
pub fn warnings() -> Vec<String> {
    let table = settings();
    let mut out = Vec::new();
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str().filter(|n| n.starts_with("CKALLOC_")) else {
            continue;
        };
        let shown = value.to_string_lossy();
        if let Some(s) = table.iter().find(|s| s.name == name) {
            if s.source == Source::Unparsed {
                out.push(format!("{name}={shown:?}: {s}; write {}", s.expected()));
            }
        } else if name == "CKALLOC_STATS_FILE" {
            let mut path = [0u8; 4096];
            if let Err(e) = stats_file_template(value.as_encoded_bytes(), u32::MAX, &mut path) {
                out.push(format!(
                    "{name}={shown:?} is not taken ({e}): no summary is written; write a path, \
                     with %p for the process ID"
                ));
            }
        } else if !OTHER_NAMES.contains(&name) {
            let known: Vec<&str> = table.iter().map(|s| s.name).chain(OTHER_NAMES).collect();
            out.push(format!(
                "{name} is not a ckalloc variable and has no effect (they are {})",
                known.join(", ")
            ));
        }
    }
    out
}
