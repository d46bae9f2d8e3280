//! The preload library's statistics as one JSON object, for programs that
//! read them at run time (the Python package's `ckalloc.stats()` calls the
//! library's exported `ckalloc_stats_json`): the preload counters, then
//! [`huge_stats`]. Written into the caller's buffer without allocating.
//!
//! Keys, each a number unless said: `preload` (`blocks`, `bytes`,
//! `threshold`, `retain_cap`, `glibc_fallbacks`, `glibc_thresholds` (a
//! string: `set`, `environment`, `program`, `refused`, `untouched`; see
//! [`GlibcThresholds`]), `glibc_mmap_threshold` and `glibc_trim_threshold`
//! (`null` unless set; the trim threshold now, raised by freed huge
//! blocks), `serves` (`true` when the process's allocator calls go to this
//! library first, `false` when they do not, `null` before the library's
//! constructor ran; [`Binding::serves`]), `ahead` (`null`, or, when they go
//! first to another object loaded ahead of it, `{object, cut, program,
//! function}`: the end of its path, whether the path was cut, whether the
//! object is the program itself, and the function found there;
//! [`Binding::Ahead`])),
//! `tiers` (`hugetlb`,
//! `thp`, `normal`, each `{blocks, bytes}`), `hugetlb_fallbacks`,
//! `hugetlb_skipped`, `thp_fallbacks`, `syscalls` (`mmap`, `munmap`,
//! `mremap`, `madvise`, `mprotect`, `munlock`), `spans`, `span_bytes`,
//! `peak_span_bytes`, `spans_released`, `unmapped_bytes`, `live_bytes`,
//! `peak_live_bytes`, `retained_bytes`, `retention_hits`,
//! `retention_misses`, `retention_carves`, `retention_extends`,
//! `grown_in_place`, `moved`, `copied`, `purged_bytes`, `decayed_bytes`,
//! `first_touch_probes`, `first_touch_slow_probes`, `first_touch_probe_ns`,
//! `first_touch_cpu_wait_ns`, `first_touch_descheduled_pages`,
//! `first_touch_populated_bytes`, `first_touch_base_blocks`,
//! `first_touch_base_bytes`, `short_tails`, `short_tails_over_budget`,
//! `background_thread` (a string: `off`, `wanted`, `starting`, `running`,
//! `failed to start`, `disabled`), `background_passes`,
//! `base_page_first_bytes`, `huge_page_first_bytes`, `huge_checks`,
//! `huge_checks_dear`, `huge_fault_mean_ns`, `collapsed_bytes`, `collapse_ns`,
//! `collapse_failures`, `collapse_races`, `collapsed_live_bytes`,
//! `thp_enabled`, `thp_defrag` (strings, `null` when unreadable),
//! `stats_file` (`CKALLOC_STATS_FILE` as set, a string; `null` when unset
//! or empty),
//! `settings` (each `CKALLOC_*` name to `{value, source}`, `source` one of
//! `default`, `environment`, `unparsed`; `value` is `null` for
//! `CKALLOC_BACKGROUND_THREAD` while it is not set, each front then taking
//! its own default: [`Setting::value_for_all_fronts`]). Sizes are in
//! bytes, times in nanoseconds; the fields mean what [`HugeStats`]'s do.
//!
//! [`Setting::value_for_all_fronts`]: crate::env::Setting::value_for_all_fronts

use super::{binding, stats, Binding, GlibcThresholds};
use crate::env::Source;
use crate::huge::{huge_stats, HugeStats};
use std::fmt::Write;

/// Writes what fits into a slice and counts every byte, so a caller whose
/// buffer was short learns the length it needs.
struct Counting<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl Write for Counting<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let start = self.len.min(self.buf.len());
        let room = self.buf.len() - start;
        let n = room.min(s.len());
        self.buf[start..start + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len = self.len.saturating_add(s.len());
        Ok(())
    }
}

/// Write the statistics as one JSON object (UTF-8, no trailing newline)
/// into `out`, as `snprintf` writes (C99 7.19.6.5): at most
/// `out.len() - 1` bytes of it and always a NUL after them, unless `out`
/// is empty. Returns the object's length in bytes without the NUL, whether
/// or not it fit: the caller with a buffer shorter than that plus one asks
/// again. Never allocates; thread-safe (the counters are read with relaxed
/// atomics, so fields are each current, not a snapshot of one moment).
pub fn write_stats_json(out: &mut [u8]) -> usize {
    let room = out.len().saturating_sub(1);
    let mut w = Counting {
        buf: &mut out[..room],
        len: 0,
    };
    // `Counting` never fails.
    let _ = write_object(&mut w, &huge_stats());
    let len = w.len;
    if let Some(nul) = out.get_mut(len.min(room)) {
        *nul = 0;
    }
    len
}

fn write_object(w: &mut Counting<'_>, h: &HugeStats) -> std::fmt::Result {
    let p = stats();
    write!(
        w,
        "{{\"preload\":{{\"blocks\":{},\"bytes\":{},\"threshold\":{},\"retain_cap\":{},\
         \"glibc_fallbacks\":{},\"glibc_thresholds\":\"{}\",\"glibc_mmap_threshold\":",
        p.blocks,
        p.bytes,
        p.threshold,
        p.retain_cap,
        p.glibc_fallbacks,
        p.glibc_thresholds.name()
    )?;
    match p.glibc_thresholds {
        GlibcThresholds::Set(t) => write!(w, "{},\"glibc_trim_threshold\":{}", t.mmap, t.trim)?,
        _ => w.write_str("null,\"glibc_trim_threshold\":null")?,
    }
    let b = binding();
    match b.serves() {
        Some(serves) => write!(w, ",\"serves\":{serves},\"ahead\":")?,
        None => w.write_str(",\"serves\":null,\"ahead\":")?,
    }
    match b {
        Binding::Ahead(a) => {
            w.write_str("{\"object\":")?;
            write_string(w, a.object)?;
            write!(
                w,
                ",\"cut\":{},\"program\":{},\"function\":",
                a.cut, a.program
            )?;
            write_string(w, a.function.to_bytes())?;
            w.write_str("}")?;
        }
        _ => w.write_str("null")?,
    }
    w.write_str("},\"tiers\":{")?;
    for (i, (name, t)) in [("hugetlb", h.hugetlb), ("thp", h.thp), ("normal", h.normal)]
        .into_iter()
        .enumerate()
    {
        let comma = if i > 0 { "," } else { "" };
        write!(
            w,
            "{comma}\"{name}\":{{\"blocks\":{},\"bytes\":{}}}",
            t.blocks, t.bytes
        )?;
    }
    let s = &h.syscalls;
    write!(
        w,
        "}},\"syscalls\":{{\"mmap\":{},\"munmap\":{},\"mremap\":{},\"madvise\":{},\
         \"mprotect\":{},\"munlock\":{}}}",
        s.mmap, s.munmap, s.mremap, s.madvise, s.mprotect, s.munlock
    )?;
    let numbers: [(&str, u64); 41] = [
        ("hugetlb_fallbacks", h.hugetlb_fallbacks),
        ("hugetlb_skipped", h.hugetlb_skipped),
        ("thp_fallbacks", h.thp_fallbacks),
        ("spans", h.spans),
        ("span_bytes", h.span_bytes),
        ("peak_span_bytes", h.peak_span_bytes),
        ("spans_released", h.spans_released),
        ("unmapped_bytes", h.unmapped_bytes),
        ("live_bytes", h.live_bytes),
        ("peak_live_bytes", h.peak_live_bytes),
        ("retained_bytes", h.retained_bytes),
        ("retention_hits", h.retention_hits),
        ("retention_misses", h.retention_misses),
        ("retention_carves", h.retention_carves),
        ("retention_extends", h.retention_extends),
        ("grown_in_place", h.grown_in_place),
        ("moved", h.moved),
        ("copied", h.copied),
        ("purged_bytes", h.purged_bytes),
        ("decayed_bytes", h.decayed_bytes),
        ("first_touch_probes", h.first_touch_probes),
        ("first_touch_slow_probes", h.first_touch_slow_probes),
        ("first_touch_probe_ns", h.first_touch_probe_ns),
        ("first_touch_cpu_wait_ns", h.first_touch_cpu_wait_ns),
        (
            "first_touch_descheduled_pages",
            h.first_touch_descheduled_pages,
        ),
        ("first_touch_populated_bytes", h.first_touch_populated_bytes),
        ("first_touch_base_blocks", h.first_touch_base_blocks),
        ("first_touch_base_bytes", h.first_touch_base_bytes),
        ("short_tails", h.short_tails),
        ("short_tails_over_budget", h.short_tails_over_budget),
        ("background_passes", h.background_passes),
        ("base_page_first_bytes", h.base_page_first_bytes),
        ("huge_page_first_bytes", h.huge_page_first_bytes),
        ("huge_checks", h.huge_checks),
        ("huge_checks_dear", h.huge_checks_dear),
        ("huge_fault_mean_ns", h.huge_fault_mean_ns),
        ("collapsed_bytes", h.collapsed_bytes),
        ("collapse_ns", h.collapse_ns),
        ("collapse_failures", h.collapse_failures),
        ("collapse_races", h.collapse_races),
        ("collapsed_live_bytes", h.collapsed_live_bytes),
    ];
    for (name, v) in numbers {
        write!(w, ",\"{name}\":{v}")?;
    }
    write!(
        w,
        ",\"background_thread\":\"{}\"",
        h.background_thread.name()
    )?;
    let t = &h.thp_settings;
    write_name(w, "thp_enabled", t.enabled.map(|e| e.name()))?;
    write_name(w, "thp_defrag", t.defrag.map(|d| d.name()))?;
    w.write_str(",\"stats_file\":")?;
    match crate::env::stats_file() {
        Some(path) => write_string(w, path)?,
        None => w.write_str("null")?,
    }
    w.write_str(",\"settings\":{")?;
    for (i, s) in h.settings.iter().enumerate() {
        let source = match s.source {
            Source::Default => "default",
            Source::Environment => "environment",
            Source::Unparsed => "unparsed",
        };
        let comma = if i > 0 { "," } else { "" };
        write!(w, "{comma}\"{}\":{{\"value\":", s.name)?;
        match s.value_for_all_fronts() {
            Some(v) => write!(w, "{v}")?,
            None => w.write_str("null")?,
        }
        write!(w, ",\"source\":\"{source}\"}}")?;
    }
    w.write_str("}}")
}

/// `,"key":"value"`, or `,"key":null`.
fn write_name(w: &mut Counting<'_>, key: &str, value: Option<&str>) -> std::fmt::Result {
    match value {
        Some(v) => write!(w, ",\"{key}\":\"{v}\""),
        None => write!(w, ",\"{key}\":null"),
    }
}

/// `bytes` as a JSON string: quote and backslash escaped, control
/// characters as `\u00XX`, each byte sequence that is not UTF-8 as U+FFFD.
fn write_string(w: &mut Counting<'_>, bytes: &[u8]) -> std::fmt::Result {
    w.write_str("\"")?;
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => w.write_str("\\\"")?,
                '\\' => w.write_str("\\\\")?,
                c if u32::from(c) < 0x20 => write!(w, "\\u{:04x}", u32::from(c))?,
                c => w.write_char(c)?,
            }
        }
        if !chunk.invalid().is_empty() {
            w.write_char(char::REPLACEMENT_CHARACTER)?;
        }
    }
    w.write_str("\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_buffer_gets_a_cut_object_and_the_length_it_needs() {
        let mut big = [0u8; 16384];
        let len = write_stats_json(&mut big);
        assert!(len < big.len(), "{len}");
        assert_eq!(big[len], 0);
        let text = std::str::from_utf8(&big[..len]).unwrap();
        assert!(text.starts_with("{\"preload\":{\"blocks\":"), "{text}");
        assert!(text.ends_with("}}"), "{text}");
        assert!(text.contains("\"settings\":{\"CKALLOC_RETAIN_BYTES\":{\"value\":"));
        // As `snprintf`: the bytes that fit, then a NUL.
        let mut small = [0xffu8; 10];
        assert_eq!(write_stats_json(&mut small), len);
        assert_eq!(&small[..9], &big[..9]);
        assert_eq!(small[9], 0);
        let mut one = [0xffu8; 1];
        assert_eq!(write_stats_json(&mut one), len);
        assert_eq!(one, [0]);
        let mut exact = vec![0xffu8; len + 1];
        assert_eq!(write_stats_json(&mut exact), len);
        assert_eq!(exact[len], 0);
        assert!(exact[..len].ends_with(b"}}"));
        assert_eq!(write_stats_json(&mut []), len);
    }

    #[test]
    fn a_path_is_a_json_string_whatever_its_bytes() {
        let mut buf = [0u8; 64];
        let mut w = Counting {
            buf: &mut buf,
            len: 0,
        };
        write_string(&mut w, b"/t\"mp\\a\n\xffb\xc3\xa9.%p").unwrap();
        let len = w.len;
        let text = std::str::from_utf8(&buf[..len]).unwrap();
        assert_eq!(text, "\"/t\\\"mp\\\\a\\u000a\u{fffd}b\u{e9}.%p\"");
    }
}
