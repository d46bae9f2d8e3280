//! The `CKALLOC_*` variables of this process's environment, checked for
//! `ckalloc run` (before the program starts, as warnings) and `ckalloc
//! probe` (as hints): each value the library will not take, with why and
//! what it uses instead, a summary file that cannot be written, a
//! `CKALLOC_PRELOAD_THRESHOLD` below one huge page, and each name that is a
//! near miss of a setting's (a typo). The library itself says nothing about
//! them (it never writes to a stream the program did not ask for). Other
//! `CKALLOC_*` names (the repository's scripts read some) pass silently.

use ckalloc::env::{
    settings, size_error, small_preload_threshold, stats_file_template, Source, PATH_MAX,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The variable naming the summary's file.
const STATS_FILE: &str = "CKALLOC_STATS_FILE";

/// The variables of the `ckalloc` command itself (`env`'s table), which the
/// library does not read: not typos, and names a typo may be near.
const OTHER_NAMES: [&str; 2] = ["CKALLOC_PRELOAD_LIB", "CKALLOC_MODEL_CACHE"];

/// Linux's `NAME_MAX`: the most bytes of one name in a path.
const NAME_MAX: usize = 255;

/// One line per `CKALLOC_*` variable of this process's environment that is
/// not taken as written, in the environment's order (a name that differs
/// from a setting's by case, or by at most two letters, is a typo), then
/// the threshold's warning. Values and names are quoted; print the lines
/// through [`ckalloc::Escaped`].
pub fn warnings() -> Vec<String> {
    let table = settings();
    let names: Vec<&str> = table
        .iter()
        .map(|s| s.name)
        .chain([STATS_FILE])
        .chain(OTHER_NAMES)
        .collect();
    let mut out = Vec::new();
    for (name, value) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if !name.starts_with("CKALLOC_") {
            // A near miss of the prefix itself (`ckalloc_thp`, `CKALOC_THP`).
            let upper = name.to_ascii_uppercase();
            if let Some(near) = names.iter().find(|n| edit_distance(n, &upper) <= 2) {
                out.push(format!(
                    "{name:?} is not a ckalloc setting and has no effect; did you mean {near}?"
                ));
            }
            continue;
        }
        let shown = value.to_string_lossy();
        if let Some(s) = table.iter().find(|s| s.name == name) {
            if s.source == Source::Unparsed {
                let why = size_error(s).map(|e| format!("{e}; ")).unwrap_or_default();
                out.push(format!(
                    "{name}={shown:?}: {why}{s}; write {}",
                    s.expected()
                ));
            }
        } else if name == STATS_FILE {
            if let Err(why) = stats_file_problem(&value) {
                out.push(format!(
                    "{name}={shown:?}: {why}, so no summary is written; write a path in a \
                     writable directory, with %p for the process ID"
                ));
            }
        } else if OTHER_NAMES.contains(&&*name) {
            continue;
        } else if let Some(near) = names
            .iter()
            .find(|n| edit_distance(n, &name.to_ascii_uppercase()) <= 2)
        {
            out.push(format!(
                "{:?} is not a ckalloc setting and has no effect; did you mean {near}?",
                name
            ));
        }
    }
    out.extend(small_preload_threshold().map(|t| t.to_string()));
    out
}

/// Why the summary could not be written where the `CKALLOC_STATS_FILE`
/// template `value` says (for this process's ID, as the program's would
/// be alike): the template is not taken, a name in the path is longer than
/// `NAME_MAX`, the file is a directory or not writable, or (for a file not
/// there yet) its directory is missing or not writable.
fn stats_file_problem(value: &OsStr) -> Result<(), String> {
    let mut buf = [0u8; PATH_MAX];
    // Taken only when it expands for the largest process ID.
    stats_file_template(value.as_bytes(), u32::MAX, &mut buf)
        .map_err(|e| format!("not taken ({e})"))?;
    let len = stats_file_template(value.as_bytes(), std::process::id(), &mut buf)
        .map_err(|e| format!("not taken ({e})"))?;
    let path = Path::new(OsStr::from_bytes(&buf[..len]));
    if path.components().any(|c| c.as_os_str().len() > NAME_MAX) {
        return Err(format!(
            "a name in the path is longer than {NAME_MAX} bytes"
        ));
    }
    let allowed = |p: &Path, mode: libc::c_int| {
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
            return false;
        };
        // SAFETY: a NUL-terminated path.
        unsafe { libc::access(c.as_ptr(), mode) == 0 }
    };
    // The library appends to a file that exists (a FIFO or a terminal
    // too, opened without blocking) and creates one that does not.
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(format!("{} is a directory", path.display())),
        Ok(_) if !allowed(path, libc::W_OK) => Err(format!("{} is not writable", path.display())),
        Ok(_) => Ok(()),
        Err(_) => {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            if !dir.is_dir() {
                return Err(format!("{} is not a directory", dir.display()));
            }
            if !allowed(dir, libc::W_OK | libc::X_OK) {
                return Err(format!("{} is not writable", dir.display()));
            }
            Ok(())
        }
    }
}

/// The Levenshtein distance of two ASCII names (bytes inserted, deleted or
/// replaced).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &x) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &y) in b.iter().enumerate() {
            let next = (diagonal + usize::from(x != y))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_misses_of_a_setting_are_typos_and_other_names_are_not() {
        assert_eq!(edit_distance("CKALLOC_THP", "CKALLOC_THP"), 0);
        assert_eq!(
            edit_distance("CKALLOC_RETAIN_BYTES", "CKALLOC_RETAIN_BYTE"),
            1
        );
        assert_eq!(edit_distance("CKALLOC_SHOW_STATS", "CKALLOC_SHOWSTAT"), 2);
        assert!(edit_distance("CKALLOC_THP", "CKALLOC_FETCH_TRIES") > 2);
    }

    #[test]
    fn a_summary_file_in_a_missing_or_unwritable_place_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        let problem = |v: &str| stats_file_problem(OsStr::new(v));
        assert_eq!(problem(&format!("{d}/ck.%p.txt")), Ok(()));
        assert!(problem(&format!("{d}/missing/ck.txt"))
            .unwrap_err()
            .contains("not a directory"));
        assert!(problem(d).unwrap_err().contains("is a directory"));
        assert_eq!(
            problem("/dev/stderr"),
            Ok(()),
            "a terminal or a pipe is written"
        );
        let long = "a".repeat(300);
        assert!(problem(&format!("{d}/{long}"))
            .unwrap_err()
            .contains("longer than 255"));
        assert!(problem("/tmp/x-%d").unwrap_err().starts_with("not taken"));
    }
}
