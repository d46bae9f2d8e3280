//! The `CKALLOC_*` variables of this process's environment, checked for
//! `ckalloc run` (before the program starts, as warnings) and `ckalloc
//! probe` (as hints): each value the library will not take, with why and
//! what it uses instead, a summary file that cannot be written, a
//! `CKALLOC_PRELOAD_THRESHOLD` below one huge page, and each name that is a
//! near miss of a setting's (a typo). The library itself says nothing about
//! them (it never writes to a stream the program did not ask for). Other
//! `CKALLOC_*` names (the repository's scripts read some) pass silently.

use crate::access::permitted;
use ckalloc::env::{
    millis_error, settings, size_error, small_preload_threshold, stats_file_template, Setting,
    Source, PATH_MAX,
};
use std::ffi::{OsStr, OsString};
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
/// from a setting's by case, or by at most two letters, is a typo; a name
/// set more than once is read at its first entry, as `getenv` reads it),
/// then the threshold's warning. Values and names are quoted; print the
/// lines through [`ckalloc::Escaped`].
pub fn warnings() -> Vec<String> {
    warnings_in(std::env::vars_os(), &settings())
}

/// [`warnings`] for the environment entries `vars`, in order, with the
/// settings `table` as the library reads them.
fn warnings_in(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
    table: &[Setting],
) -> Vec<String> {
    let names: Vec<&str> = table
        .iter()
        .map(|s| s.name)
        .chain([STATS_FILE])
        .chain(OTHER_NAMES)
        .collect();
    let mut out = Vec::new();
    let mut seen: Vec<OsString> = Vec::new();
    for (name, value) in vars {
        // `getenv` (the library's, and `ckalloc run`'s for
        // `CKALLOC_PRELOAD_LIB`) answers a name's first entry: a later one
        // is never read, whatever its value.
        if seen.contains(&name) {
            let read = names.iter().any(|n| OsStr::new(n) == name);
            if read {
                out.push(format!(
                    "{}={:?} is not read: {} is set more than once in the environment, and \
                     only its first value is read",
                    name.to_string_lossy(),
                    value.to_string_lossy(),
                    name.to_string_lossy()
                ));
            }
            continue;
        }
        seen.push(name.clone());
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
                let why = why_unparsed(s).map(|e| e + "; ").unwrap_or_default();
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

/// Why the value of a size or millisecond setting that does not parse is
/// refused, as the library's parser refuses it; `None` for a switch, whose
/// values are listed in [`Setting::expected`] instead.
fn why_unparsed(s: &Setting) -> Option<String> {
    size_error(s)
        .map(|e| e.to_string())
        .or_else(|| millis_error(s).map(|e| e.to_string()))
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
    // The library appends to a file that exists (a FIFO or a terminal
    // too, opened without blocking) and creates one that does not.
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(format!("{} is a directory", path.display())),
        Ok(_) if !permitted(path, libc::W_OK) => Err(format!("{} is not writable", path.display())),
        Ok(_) => Ok(()),
        Err(_) => {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            match std::fs::metadata(dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(format!("{} is not a directory", dir.display())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(format!(
                        "its directory {} does not exist (the library creates no directory)",
                        dir.display()
                    ));
                }
                Err(e) => return Err(format!("its directory {}: {e}", dir.display())),
            }
            if !permitted(dir, libc::W_OK | libc::X_OK) {
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
    fn a_name_set_twice_is_judged_by_its_first_entry_alone() {
        let mut table = settings();
        let decay = table
            .iter_mut()
            .find(|s| s.name == "CKALLOC_RETAIN_DECAY_MS")
            .unwrap();
        // As `getenv` reads an environment of `abc`, then `5`.
        decay.source = Source::Unparsed;
        let vars = [
            ("CKALLOC_RETAIN_DECAY_MS", "abc"),
            ("CKALLOC_RETAIN_DECAY_MS", "5"),
            ("CKALOC_THP", "1"),
            ("CKALOC_THP", "1"),
        ]
        .map(|(n, v)| (OsString::from(n), OsString::from(v)));
        let lines = warnings_in(vars, &table);
        let mine: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains("CKALLOC_RETAIN_DECAY_MS") || l.contains("CKALOC_THP"))
            .collect();
        assert_eq!(mine.len(), 3, "{lines:#?}");
        assert!(mine[0].starts_with("CKALLOC_RETAIN_DECAY_MS=\"abc\": "));
        assert!(mine[0].contains("does not parse"));
        assert_eq!(
            mine[1],
            "CKALLOC_RETAIN_DECAY_MS=\"5\" is not read: CKALLOC_RETAIN_DECAY_MS is set more than \
             once in the environment, and only its first value is read"
        );
        assert!(mine[2].contains("did you mean CKALLOC_THP?"));
    }

    #[test]
    fn a_summary_file_in_a_missing_or_unwritable_place_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        let problem = |v: &str| stats_file_problem(OsStr::new(v));
        assert_eq!(problem(&format!("{d}/ck.%p.txt")), Ok(()));
        assert!(problem(&format!("{d}/missing/ck.txt"))
            .unwrap_err()
            .contains("does not exist"));
        std::fs::write(dir.path().join("file"), b"").unwrap();
        assert!(problem(&format!("{d}/file/ck.txt"))
            .unwrap_err()
            .contains("file is not a directory"));
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
