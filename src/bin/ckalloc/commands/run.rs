//! `ckalloc run [--] CMD ARGS...`: run a program with the preload library
//! (`libckalloc_preload.so`) first in `LD_PRELOAD`. The program replaces
//! this process (`execve`, found as `execvp` finds it: [`exec`]), so its
//! exit status and any signal that ends it are the status of `ckalloc run`
//! itself.
//!
//! Before it starts the program it prints, on its own standard error, one
//! `ckalloc run: warning:` line per `CKALLOC_*` variable whose value the
//! library will not take (and what it uses instead) or whose name nothing
//! reads, and one when the library cannot reach the program: a statically
//! linked one (no `PT_INTERP`), a set-user-ID or set-group-ID one, or one
//! with file capabilities (`PATH` and `#!` interpreters followed; a file it
//! may execute but not read judged by its mode bits: [`program`]). These
//! are warnings: the program runs all the same.

mod elf;
mod exec;
mod mount;
mod program;
mod secure;

use crate::error::{err, CliError};
use crate::format::shown;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The library's file name.
pub const LIBRARY: &str = "libckalloc_preload.so";

/// `run`'s arguments: its options, then the program and the program's
/// arguments. The first argument that is not an option of `run` (or the
/// first after `--`) is the program, and every argument after it is the
/// program's, options and `--` included; an unknown option before the
/// program is a usage error (with a tip to put it after `--`), never taken
/// for the program.
#[derive(clap::Args, Debug)]
#[command(trailing_var_arg = true)]
pub struct RunArgs {
    /// The program and its arguments (every argument after the program is its own; write `--`
    /// before a program whose name starts with `-`).
    #[arg(required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Where the library is looked for, in order: `CKALLOC_PRELOAD_LIB` when
/// set; next to this executable; `../lib` from it (an install prefix); the
/// build folder (`target/release`, `target/debug` beside this executable's
/// folder, then those of the source tree it was built from).
/// The last [`candidates`]: the source tree's `target/release` and
/// `target/debug`.
const SOURCE_TREE_CANDIDATES: usize = 2;

fn candidates(exe: Option<&Path>) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(dir) = exe.and_then(Path::parent) {
        v.push(dir.join(LIBRARY));
        if let Some(up) = dir.parent() {
            v.push(up.join("lib").join(LIBRARY));
            v.push(up.join("release").join(LIBRARY));
            v.push(up.join("debug").join(LIBRARY));
        }
    }
    let tree = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    v.push(tree.join("release").join(LIBRARY));
    v.push(tree.join("debug").join(LIBRARY));
    v
}

/// The library to preload, or an error that says where to put it. One
/// found only in the source tree `ckalloc` was built from (which may hold
/// an older build than the executable) is named on stderr.
fn find_library() -> Result<PathBuf, CliError> {
    if let Some(p) = ckalloc::env::preload_lib() {
        return checked(&p).map_err(|why| err(format!("CKALLOC_PRELOAD_LIB={}: {why}", shown(&p))));
    }
    let exe = std::env::current_exe().ok();
    let looked = candidates(exe.as_deref());
    if let Some(at) = looked.iter().position(|p| p.is_file()) {
        let p = &looked[at];
        let lib = checked(p).map_err(|why| err(format!("{}: {why}", shown(p))))?;
        if at + SOURCE_TREE_CANDIDATES >= looked.len() {
            crate::errln!(
                "ckalloc run: preloading {} from the source tree ckalloc was built from; put \
                 {LIBRARY} next to the ckalloc executable or set CKALLOC_PRELOAD_LIB to choose",
                shown(&lib)
            );
        }
        return Ok(lib);
    }
    let list: Vec<String> = looked.iter().map(|p| shown(p)).collect();
    Err(err(format!(
        "{LIBRARY} not found (looked in {}); build it with `cargo build --release -p \
         ckalloc-preload` in ckalloc's source tree and put target/release/{LIBRARY} next to \
         the ckalloc executable (`cargo install` installs no shared library), or set \
         CKALLOC_PRELOAD_LIB to its path",
        list.join(", ")
    )))
}

/// A symbol only the library exports (`ckalloc_stats_json`), by which it is
/// told from other shared libraries.
const LIBRARY_SYMBOL: &[u8] = b"ckalloc_stats_json";

/// `p` made absolute (a child that changes directory keeps it), once it is
/// known to be a shared library of this build's machine (an ELF file of
/// type `ET_DYN`, not an executable, whose class, byte order and
/// `e_machine` are this build's) that names the library's own symbol, and
/// whose path `LD_PRELOAD` can hold (`ld.so` splits
/// the variable at spaces and colons, expands `$` tokens, and ignores what
/// it cannot load with only a warning).
fn checked(p: &Path) -> Result<PathBuf, String> {
    let abs = std::fs::canonicalize(p).map_err(|e| e.to_string())?;
    let meta = std::fs::metadata(&abs).map_err(|e| e.to_string())?;
    if meta.is_dir() {
        return Err("is a directory, not the library file".into());
    }
    // Only a regular file is opened: a FIFO or a terminal would block.
    if !meta.is_file() {
        return Err("not a regular file (a FIFO, socket or device), not the library".into());
    }
    let file = std::fs::File::open(&abs).map_err(|e| format!("cannot be read: {e}"))?;
    // `ld.so` fails to map a library's code there.
    if mount::noexec(&file) {
        return Err(
            "on a file system mounted noexec, where ld.so cannot map it; copy it to \
                    another file system"
                .into(),
        );
    }
    let not_ours = "an ELF file not built for this machine, or damaged";
    let header = match elf::Header::read(&file) {
        Ok(h) if h.of_this_machine() => h,
        Ok(_) | Err(elf::HeaderError::Damaged) => return Err(not_ours.into()),
        Err(elf::HeaderError::NotElf) => return Err("not a shared library (no ELF header)".into()),
        Err(elf::HeaderError::Read(e)) => return Err(format!("cannot be read: {e}")),
    };
    let not_library = "an ELF file that is not a shared library (an executable or an object file)";
    if header.file_type != elf::ET_DYN {
        return Err(not_library.into());
    }
    // ld.so maps every loadable segment from the file: one that ends past
    // the file's end faults (SIGBUS) in the program, not in this check.
    if elf::loads_fit(&file) != Some(true) {
        return Err(
            "a damaged shared library: its program headers do not read, or a loadable \
             segment ends past the end of the file (cut short)"
                .into(),
        );
    }
    let Some(facts) = elf::dynamic_facts(&abs, LIBRARY_SYMBOL) else {
        return Err("a damaged shared library: its dynamic section does not read".into());
    };
    if facts.pie {
        return Err(not_library.into());
    }
    if !facts.defines_symbol {
        return Err(format!(
            "a shared library, but not {LIBRARY} (it defines no symbol {})",
            String::from_utf8_lossy(LIBRARY_SYMBOL)
        ));
    }
    let text = abs.to_string_lossy();
    if text.contains([' ', ':', '$']) {
        return Err(format!(
            "its path {} holds a space or a colon, where ld.so splits LD_PRELOAD, or a $, \
             which ld.so expands ($ORIGIN, $LIB, $PLATFORM); copy it to a path without one and \
             set CKALLOC_PRELOAD_LIB to that path",
            shown(&abs)
        ));
    }
    Ok(abs)
}

/// The entries of an `LD_PRELOAD` value that are allocators (a file name
/// with `malloc` in it: jemalloc, tcmalloc, mimalloc; or this library), by
/// their own name or, for a symbolic link, by the name of the file it leads
/// to: two allocators in one process split the calls and corrupt each
/// other's blocks. A copy renamed to anything else is not recognised.
fn allocators_in(preload: &OsStr) -> Vec<String> {
    let is_allocator = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .is_some_and(|n| n.contains("malloc") || n.starts_with("libckalloc_preload"))
    };
    preload
        .to_string_lossy()
        .split([' ', ':'])
        .filter(|e| !e.is_empty())
        .filter(|e| {
            let p = Path::new(e);
            is_allocator(p) || std::fs::canonicalize(p).is_ok_and(|real| is_allocator(&real))
        })
        .map(str::to_owned)
        .collect()
}

/// `LD_PRELOAD` (`old`) with every entry that is the file `lib` written as
/// `lib` (its absolute path), the others byte for byte, separated by
/// spaces.
fn absolute_entries(old: Option<&OsStr>, lib: &Path) -> OsString {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let old = old.map(OsStr::as_bytes).unwrap_or_default();
    let mut out: Vec<u8> = Vec::new();
    for e in old
        .split(|&b| b == b' ' || b == b':')
        .filter(|e| !e.is_empty())
    {
        if !out.is_empty() {
            out.push(b' ');
        }
        let entry = OsStr::from_bytes(e);
        if std::fs::canonicalize(entry).is_ok_and(|real| real == lib) {
            out.extend_from_slice(lib.as_os_str().as_bytes());
        } else {
            out.extend_from_slice(e);
        }
    }
    OsString::from_vec(out)
}

/// `LD_PRELOAD` with `lib` first, keeping what was there.
fn preload_value(lib: &Path, old: Option<&OsStr>) -> OsString {
    let mut v = OsString::from(lib);
    if let Some(old) = old.filter(|o| !o.is_empty()) {
        v.push(" ");
        v.push(old);
    }
    v
}

/// Replace this process with the program; returns only when it cannot be
/// started: exit status 127 when it is not found, 126 otherwise (found but
/// not runnable: a directory, no permission, a missing `#!` interpreter,
/// an ELF file for another machine; as `sh` and `env` do), 1 when the
/// library is not found.
pub fn run(a: RunArgs) -> ExitCode {
    // First, so a typo of `CKALLOC_PRELOAD_LIB` shows beside "not found".
    for w in crate::settings::warnings() {
        crate::errln!("ckalloc run: warning: {}", ckalloc::Escaped::new(&w));
    }
    let lib = match find_library() {
        Ok(l) => l,
        Err(e) => return e.report(false),
    };
    let Some(program) = a.command.first() else {
        return err("no program given").report(false);
    };
    let old = std::env::var_os("LD_PRELOAD");
    let found = old.as_deref().map(allocators_in).unwrap_or_default();
    let is_lib = |e: &String| std::fs::canonicalize(e).is_ok_and(|o| o == lib);
    let preload = match found.iter().find(|e| !is_lib(e)) {
        // The same library already (`ckalloc run` inside `ckalloc run`):
        // the program gets it once, as an absolute path.
        None if !found.is_empty() => absolute_entries(old.as_deref(), &lib),
        None => preload_value(&lib, old.as_deref()),
        Some(other) => {
            return err(format!(
                "LD_PRELOAD already holds an allocator ({other}) other than {}; two allocators \
                 in one process corrupt each other's blocks: unset it, or preload only one",
                shown(&lib)
            ))
            .report(false);
        }
    };
    if let Some(w) = program::why_not_preloaded(program) {
        crate::errln!("ckalloc run: warning: {}", ckalloc::Escaped::new(&w));
    }
    let not_run = exec::exec(&a.command, &preload);
    let _ = err(not_run.why).report(false);
    ExitCode::from(not_run.code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_goes_first_and_keeps_other_preloads() {
        let lib = Path::new("/x/libckalloc_preload.so");
        assert_eq!(preload_value(lib, None), "/x/libckalloc_preload.so");
        assert_eq!(
            preload_value(lib, Some(OsStr::new("/y/libprofiler-hooks.so"))),
            "/x/libckalloc_preload.so /y/libprofiler-hooks.so"
        );
        assert_eq!(
            preload_value(lib, Some(OsStr::new(""))),
            "/x/libckalloc_preload.so"
        );
    }

    #[test]
    fn the_library_already_preloaded_is_kept_once_as_an_absolute_path() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join(LIBRARY);
        std::fs::write(&lib, b"").unwrap();
        let lib = std::fs::canonicalize(&lib).unwrap();
        let cwd = std::env::current_dir().unwrap();
        let relative = pathdiff(&lib, &cwd);
        let old = OsString::from(format!("{}:/y/libprof.so", relative.display()));
        assert_eq!(
            absolute_entries(Some(&old), &lib),
            OsString::from(format!("{} /y/libprof.so", lib.display()))
        );
    }

    /// `p` relative to `from` (both absolute).
    fn pathdiff(p: &Path, from: &Path) -> PathBuf {
        let up: PathBuf = from.components().skip(1).map(|_| "..").collect();
        up.join(p.strip_prefix("/").unwrap())
    }

    #[test]
    fn allocators_already_preloaded_are_found() {
        let found = |v: &str| allocators_in(OsStr::new(v));
        assert_eq!(
            found("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
            ["/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"]
        );
        assert_eq!(
            found("/a/libprof.so:libtcmalloc_minimal.so.4"),
            ["libtcmalloc_minimal.so.4"]
        );
        // Every allocator, not only the first.
        assert_eq!(
            found("/x/libckalloc_preload.so /y/libjemalloc.so.2"),
            ["/x/libckalloc_preload.so", "/y/libjemalloc.so.2"]
        );
        assert!(found("/a/libprof.so /b/libasan-free.so").is_empty());
        assert!(found("").is_empty());
        // A symbolic link with another name is found by its target.
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("libjemalloc.so.2");
        std::fs::write(&real, b"").unwrap();
        let link = dir.path().join("libfast.so");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let link = link.to_string_lossy().into_owned();
        assert_eq!(found(&link), [link]);
    }

    #[test]
    fn the_library_check_reads_the_elf_header_as_elf_rs_does() {
        let libc_so = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        let dir = tempfile::tempdir().unwrap();
        if !libc_so.exists() || mount::noexec(&std::fs::File::open(dir.path()).unwrap()) {
            eprintln!(
                "skipped: no {} or a noexec temporary directory",
                libc_so.display()
            );
            return;
        }
        let bytes = std::fs::read(libc_so).unwrap();
        let says = |name: &str, content: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, content).unwrap();
            checked(&p).unwrap_err()
        };
        assert!(says("empty", b"").contains("no ELF header"));
        assert!(says("text", b"not a library\n").contains("no ELF header"));
        // A header cut short is damaged, not a library whose dynamic
        // section does not read.
        assert!(says("cut", &bytes[..40]).contains("or damaged"));
        let mut arm = bytes.clone();
        arm[18..20].copy_from_slice(&40u16.to_le_bytes());
        assert!(says("arm", &arm).contains("not built for this machine"));
        let mut big = bytes.clone();
        big[5] = 2;
        assert!(says("big", &big).contains("not built for this machine"));
        let mut object = bytes.clone();
        object[16..18].copy_from_slice(&1u16.to_le_bytes());
        assert!(says("object", &object).contains("not a shared library"));
        // Cut inside its loadable segments: ld.so would fault mapping it.
        let cut = &bytes[..bytes.len() / 2];
        assert!(
            says("short", cut).contains("cut short"),
            "{}",
            says("short", cut)
        );
        assert!(says("short2", &bytes[..5000]).contains("damaged shared library"));
        assert!(says("libc", &bytes).contains("it defines no symbol ckalloc_stats_json"));
    }

    #[test]
    fn candidates_start_next_to_the_executable() {
        let c = candidates(Some(Path::new("/opt/ck/bin/ckalloc")));
        assert_eq!(c[0], Path::new("/opt/ck/bin/libckalloc_preload.so"));
        assert_eq!(c[1], Path::new("/opt/ck/lib/libckalloc_preload.so"));
    }
}
