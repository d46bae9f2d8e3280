//! `ckalloc probe`: the system's huge-page state, and what each tier does
//! when actually tried.

use crate::error::CliError;
use crate::format::ms;
use crate::output::emit_json;
use crate::{outln, Global};
use ckalloc::env::{Source, Unit};
use ckalloc::{
    huge_page_coverage, huge_stats, probe, reset_hugetlb_backoff, Backing, HugeCoverage,
    HugeOptions, HugeRegion, SystemHugePages,
};
use indicatif::BinaryBytes;
use serde_json::{json, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::time::{Duration, Instant};

/// Bytes mapped and touched per tier.
const TOUCH_BYTES: usize = 64 << 20;
const GIB: u64 = 1 << 30;

#[derive(clap::Args, Debug)]
pub struct ProbeArgs {
    /// Only read the system state; do not map and touch memory.
    #[arg(long)]
    no_touch: bool,
}

/// The outcome of trying one tier.
struct Trial {
    tier: &'static str,
    backing: Option<Backing>,
    touch: Option<Duration>,
    coverage: Option<HugeCoverage>,
    error: Option<String>,
}

impl Trial {
    fn works(&self) -> bool {
        self.error.is_none()
    }

    fn json(&self) -> Value {
        json!({
            "tier": self.tier,
            "works": self.works(),
            "backing": self.backing.map(|b| b.to_string()),
            "bytes": TOUCH_BYTES,
            "first_touch_ms": self.touch.map(ms),
            "first_touch_gib_per_s": self.touch.map(rate),
            "resident_bytes": self.coverage.map(|c| c.mapped_bytes),
            "huge_bytes": self.coverage.map(|c| c.huge_bytes),
            "error": self.error,
        })
    }
}

fn rate(d: Duration) -> f64 {
    TOUCH_BYTES as f64 / GIB as f64 / d.as_secs_f64().max(1e-9)
}

/// Write one byte in every base page of `ptr..ptr+len` (the first touch
/// faults each page in) and return how long it took.
///
/// # Safety
/// `ptr..ptr+len` must be writable memory owned by the caller.
unsafe fn first_touch(ptr: *mut u8, len: usize, page: usize) -> Duration {
    let t = Instant::now();
    let mut off = 0;
    while off < len {
        // SAFETY: off < len and the caller guarantees the range is writable;
        // volatile so the stores (and their page faults) are not elided.
        unsafe { ptr.add(off).write_volatile(1) };
        off += page;
    }
    t.elapsed()
}

fn try_region(tier: &'static str, opts: HugeOptions, page: usize) -> Trial {
    match HugeRegion::with_options(TOUCH_BYTES, &opts) {
        Ok(mut r) => {
            let len = r.len();
            // SAFETY: the region owns `len` writable bytes at as_mut_ptr().
            let touch = unsafe { first_touch(r.as_mut_ptr(), len, page) };
            Trial {
                tier,
                backing: Some(r.backing()),
                touch: Some(touch),
                coverage: r.coverage().ok(),
                error: None,
            }
        }
        Err(e) => Trial {
            tier,
            backing: None,
            touch: None,
            coverage: None,
            error: Some(short_error(&e.to_string())),
        },
    }
}

/// The library's messages carry a remedy after `;`; probe prints its own.
fn short_error(s: &str) -> String {
    s.split(';').next().unwrap_or(s).trim().to_string()
}

/// Normal pages: `System` memory with no huge-page advice (under THP
/// `always` the kernel may still back it with huge pages; coverage shows it).
fn try_normal(page: usize) -> Trial {
    let Ok(layout) = Layout::from_size_align(TOUCH_BYTES, page) else {
        return Trial {
            tier: "normal",
            backing: None,
            touch: None,
            coverage: None,
            error: Some(format!("bad layout for page size {page}")),
        };
    };
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { System.alloc(layout) };
    if p.is_null() {
        return Trial {
            tier: "normal",
            backing: None,
            touch: None,
            coverage: None,
            error: Some(format!("malloc of {TOUCH_BYTES} bytes failed")),
        };
    }
    // SAFETY: p owns TOUCH_BYTES writable bytes until the dealloc below.
    let touch = unsafe { first_touch(p, TOUCH_BYTES, page) };
    let coverage = huge_page_coverage(p, TOUCH_BYTES).ok();
    // SAFETY: p came from System.alloc with this layout and is freed once.
    unsafe { System.dealloc(p, layout) };
    Trial {
        tier: "normal",
        backing: Some(Backing::Normal),
        touch: Some(touch),
        coverage,
        error: None,
    }
}

/// `CKALLOC_THP` set to a false value turns THP off for ckalloc (the rule is
/// the library's, see `ckalloc::env`).
fn thp_env_off() -> bool {
    !ckalloc::env::thp_allowed()
}

/// One line per thing that is missing, saying how to enable it.
fn hints(sys: &SystemHugePages, trials: &[Trial]) -> Vec<String> {
    let mut h = Vec::new();
    let find = |t: &str| trials.iter().find(|x| x.tier == t);
    let pages_2m = (TOUCH_BYTES as u64).div_ceil(2 << 20);
    match (sys.pool(2 << 20), find("hugetlb")) {
        (None, _) if sys.hugetlb.is_empty() => h.push(
            "hugetlb: the kernel has no hugetlbfs (CONFIG_HUGETLBFS); THP is the best tier here"
                .to_string(),
        ),
        // Without a trial (`--no-touch`), only when too few pages are free
        // for the 64 MiB a trial would take.
        (Some(p), t) if t.map_or(p.free < pages_2m, |t| !t.works()) => h.push(format!(
            "hugetlb: {} free 2 MiB pages; reserve some as root: `echo {} > /proc/sys/vm/nr_hugepages` \
             (persist with vm.nr_hugepages in /etc/sysctl.conf)",
            p.free,
            p.total + pages_2m
        )),
        _ => {}
    }
    if !ckalloc::env::hugetlb_allowed() {
        h.push(
            "hugetlb: turned off for ckalloc by CKALLOC_HUGETLB (skipped unless a caller \
             requires it); unset it"
                .into(),
        );
    }
    if let Some(p) = sys.pool(GIB) {
        if p.free == 0 {
            h.push(
                "1 GiB pages: none free; as root `echo 1 > /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages` \
                 (or boot with hugepagesz=1G hugepages=N), then HugeOptions::allow_1gib(true)"
                    .to_string(),
            );
        }
    }
    match sys.thp_enabled.as_deref() {
        None => h.push(
            "THP: the kernel has no transparent huge pages (CONFIG_TRANSPARENT_HUGEPAGE)".into(),
        ),
        Some("never") => h.push(
            "THP: disabled; as root `echo madvise > /sys/kernel/mm/transparent_hugepage/enabled`"
                .into(),
        ),
        _ if thp_env_off() => h.push("THP: turned off for ckalloc by CKALLOC_THP; unset it".into()),
        _ => {
            if let Some(t) = find("THP").filter(|t| t.works()) {
                if t.coverage.is_some_and(|c| c.huge_bytes == 0) {
                    h.push(format!(
                        "THP: advised but no huge pages were faulted in (defrag: {}); try as root \
                         `echo defer+madvise > /sys/kernel/mm/transparent_hugepage/defrag` or \
                         `echo 1 > /proc/sys/vm/compact_memory`",
                        sys.thp_defrag.as_deref().unwrap_or("?")
                    ));
                }
            }
        }
    }
    if sys.free_page_reporting {
        let timed = if trials.is_empty() {
            "`ckalloc probe` without --no-touch times a first touch; "
        } else {
            "the first touches above show it; "
        };
        h.push(format!(
            "free page reporting: this VM hands free 2 MiB blocks back to its host, so fresh huge \
             pages may fault on the host too ({timed}CkHuge's first-touch probe falls back to \
             4 KiB pages when THP faults are slow)"
        ));
    }
    h.extend(crate::settings::warnings());
    if sys.memlock_soft.is_some_and(|l| l < TOUCH_BYTES as u64) {
        h.push(format!(
            "mlock: RLIMIT_MEMLOCK is {}; HugeOptions::mlock needs more: `ulimit -l unlimited` or CAP_IPC_LOCK",
            BinaryBytes(sys.memlock_soft.unwrap_or(0))
        ));
    }
    h
}

fn system_json(sys: &SystemHugePages) -> Value {
    json!({
        "thp_enabled": sys.thp_enabled,
        "thp_defrag": sys.thp_defrag,
        "thp_advised_fault_compacts": sys.thp.defrag.map(|d| d.advised_fault_compacts()),
        "khugepaged": sys.thp.khugepaged.map(|k| json!({
            "defrag": k.defrag,
            "pages_to_scan": k.pages_to_scan,
            "scan_sleep_ms": k.scan_sleep_ms,
            "alloc_sleep_ms": k.alloc_sleep_ms,
            "max_ptes_none": k.max_ptes_none,
        })),
        "base_page_size": sys.base_page_size,
        "hugetlb": sys.hugetlb.iter().map(|p| json!({
            "page_size": p.page_size, "total": p.total, "free": p.free,
        })).collect::<Vec<_>>(),
        "memlock_soft": sys.memlock_soft,
        "memlock_hard": sys.memlock_hard,
        "free_page_reporting": sys.free_page_reporting,
        "page_reporting_order": sys.page_reporting_order,
    })
}

fn settings_json() -> Value {
    Value::Array(
        huge_stats()
            .settings
            .iter()
            .map(|s| {
                json!({
                    "name": s.name,
                    "value": s.value_for_all_fronts(),
                    "unit": match s.unit {
                        Unit::Bytes => "bytes",
                        Unit::Milliseconds => "ms",
                        Unit::Switch => "switch",
                        Unit::Word(_) => "word",
                    },
                    "source": match s.source {
                        Source::Default => "default",
                        Source::Environment => "environment",
                        Source::Unparsed => "unparsed",
                    },
                })
            })
            .collect(),
    )
}

pub fn run(g: Global, a: ProbeArgs) -> Result<(), CliError> {
    let sys = probe();
    let page = usize::try_from(sys.base_page_size)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096);
    let trials = if a.no_touch {
        Vec::new()
    } else {
        let t = vec![
            try_region(
                "hugetlb",
                HugeOptions::new().require(Backing::Hugetlb),
                page,
            ),
            try_region(
                "THP",
                HugeOptions::new()
                    .hugetlb(false)
                    .require(Backing::TransparentHuge),
                page,
            ),
            try_normal(page),
        ];
        // A failed hugetlb attempt starts the library's back-off; forget it.
        reset_hugetlb_backoff();
        t
    };
    let hints = hints(&sys, &trials);
    if g.json {
        emit_json(&json!({
            "system": system_json(&sys),
            "settings": settings_json(),
            "stats_file": std::env::var_os("CKALLOC_STATS_FILE")
                .filter(|v| !v.is_empty())
                .map(|v| v.to_string_lossy().into_owned()),
            "tiers": trials.iter().map(Trial::json).collect::<Vec<_>>(),
            "hints": hints,
        }));
        return Ok(());
    }
    outln!("{sys}");
    let settings = huge_stats().settings;
    outln!("settings:        {}", settings[0]);
    for s in &settings[1..] {
        outln!("                 {s}");
    }
    match std::env::var_os("CKALLOC_STATS_FILE").filter(|v| !v.is_empty()) {
        Some(v) => outln!(
            "                 CKALLOC_STATS_FILE {:?}",
            v.to_string_lossy()
        ),
        None => outln!("                 CKALLOC_STATS_FILE unset (summaries go to stderr)"),
    }
    if !trials.is_empty() {
        outln!();
        outln!(
            "{:<8} {:<6} {:<13} {:<28} huge pages",
            "tier",
            "works",
            "backing",
            "first touch of 64 MiB"
        );
        for t in &trials {
            let backing = t.backing.map(|b| b.to_string()).unwrap_or("-".into());
            let touch = t
                .touch
                .map(|d| format!("{:.1} ms ({:.2} GiB/s)", ms(d), rate(d)))
                .unwrap_or("-".into());
            let cov = match (&t.error, t.coverage) {
                (Some(e), _) => e.clone(),
                (None, Some(c)) => c.to_string(),
                (None, None) => "coverage unavailable".into(),
            };
            outln!(
                "{:<8} {:<6} {:<13} {:<28} {}",
                t.tier,
                if t.works() { "yes" } else { "no" },
                backing,
                touch,
                cov
            );
        }
    }
    if !hints.is_empty() {
        outln!();
        outln!("to enable what is missing:");
        for h in &hints {
            outln!("  {h}");
        }
    }
    Ok(())
}
