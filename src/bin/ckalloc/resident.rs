//! Resident memory of this process (`/proc/self/status`), for the
//! closing lines of `load` and of each demo mode.

use indicatif::BinaryBytes;
use serde_json::{json, Value};

/// Resident memory in bytes; a field `/proc/self/status` lacks (or that
/// cannot be read) is `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resident {
    /// `VmRSS`: all resident memory (hugetlb pages not included).
    pub rss: Option<u64>,
    /// `RssAnon`: anonymous memory.
    pub rss_anon: Option<u64>,
    /// `RssFile`: file-backed memory.
    pub rss_file: Option<u64>,
    /// `HugetlbPages`: hugetlb pages, not part of `VmRSS`.
    pub hugetlb: Option<u64>,
    /// `VmHWM`: the peak of `VmRSS`.
    pub peak_rss: Option<u64>,
}

impl Resident {
    /// Read `/proc/self/status` now.
    pub fn read() -> Resident {
        Resident::parse(&std::fs::read_to_string("/proc/self/status").unwrap_or_default())
    }

    /// The fields of a `/proc/PID/status` text (values in kB).
    fn parse(text: &str) -> Resident {
        let get = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kb| kb * 1024)
        };
        Resident {
            rss: get("VmRSS:"),
            rss_anon: get("RssAnon:"),
            rss_file: get("RssFile:"),
            hugetlb: get("HugetlbPages:"),
            peak_rss: get("VmHWM:"),
        }
    }

    /// `resident: X (anonymous A, file F)[ + hugetlb H], peak P`.
    pub fn line(&self) -> String {
        let f = |v: Option<u64>| {
            v.map(|b| BinaryBytes(b).to_string())
                .unwrap_or_else(|| "?".into())
        };
        let hugetlb = match self.hugetlb {
            Some(h) if h > 0 => format!(" + hugetlb {}", BinaryBytes(h)),
            _ => String::new(),
        };
        format!(
            "resident: {} (anonymous {}, file {}){hugetlb}, peak {}",
            f(self.rss),
            f(self.rss_anon),
            f(self.rss_file),
            f(self.peak_rss)
        )
    }

    /// `{rss_bytes, rss_anon_bytes, rss_file_bytes, hugetlb_bytes, peak_rss_bytes}`.
    pub fn json(&self) -> Value {
        json!({
            "rss_bytes": self.rss,
            "rss_anon_bytes": self.rss_anon,
            "rss_file_bytes": self.rss_file,
            "hugetlb_bytes": self.hugetlb,
            "peak_rss_bytes": self.peak_rss,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_by_name() {
        let r = Resident::parse(
            "Name:\tckalloc\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssAnon:\t   512 kB\n\
             RssFile:\t   512 kB\nHugetlbPages:\t       0 kB\n",
        );
        assert_eq!(
            r,
            Resident {
                rss: Some(1 << 20),
                rss_anon: Some(512 << 10),
                rss_file: Some(512 << 10),
                hugetlb: Some(0),
                peak_rss: Some(2 << 20),
            }
        );
        assert_eq!(
            r.line(),
            "resident: 1.00 MiB (anonymous 512.00 KiB, file 512.00 KiB), peak 2.00 MiB"
        );
        let none = Resident::parse("");
        assert_eq!(none, Resident::default());
        assert_eq!(none.line(), "resident: ? (anonymous ?, file ?), peak ?");
        assert_eq!(
            r.json(),
            json!({
                "rss_bytes": 1 << 20, "rss_anon_bytes": 512 << 10, "rss_file_bytes": 512 << 10,
                "hugetlb_bytes": 0, "peak_rss_bytes": 2 << 20,
            })
        );
        assert!(none
            .json()
            .as_object()
            .unwrap()
            .values()
            .all(Value::is_null));
    }
}
