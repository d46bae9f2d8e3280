//! The memory states the benchmark drivers start every run in, and the
//! statistics and machine facts their reports print. Shared by the
//! `real-client` driver (this package) and the preload client
//! (`benches/preload-client`, which includes this file by path).

/// Memory touched and unmapped before every run, in MiB.
///
/// The preparation gives every contender guest memory that the host backs
/// (the warm state). In a VM with free page reporting (virtio-balloon;
/// Linux's `mm/page_reporting.c`, order 9 here), free 2 MiB blocks are
/// handed back to the host, and a page taken from a reported block faults
/// on the host as well. Measured on this machine, first touch of 180 MiB
/// right after the preparation:
///
/// | preparation | THP pages | 4 KiB pages |
/// | --- | --- | --- |
/// | 512 MiB advised `MADV_HUGEPAGE` | 29-35 ms | 76-95 ms |
/// | 512 MiB of 4 KiB pages | 31-566 ms | 73-117 ms |
/// | 2048 MiB of 4 KiB pages | 45-532 ms (4 of 5 over 349) | 69-84 ms |
///
/// Touched as 2 MiB pages, the preparation leaves whole host-backed 2 MiB
/// blocks on the free lists, which both page sizes draw from; 4 KiB
/// preparations leave a lottery of reported and unreported blocks, and a
/// large one is reported as soon as it is freed. 512 MiB covers a run's
/// peak (~250 MiB); 1024 MiB advised made later 4 KiB touches slow in 3 of
/// 5 trials (139-298 ms).
pub const DEFAULT_PREP_MIB: usize = 512;

/// The memory state every run starts in (`--state`).
///
/// - `thp`: [`DEFAULT_PREP_MIB`] MiB (`--prep-mib`, which no other state uses) advised `MADV_HUGEPAGE`, touched and
///   unmapped before each run: host-backed 2 MiB blocks on the guest's free
///   lists, the state in which fresh huge pages are cheap.
/// - `4k`: once, at the start, most of the guest's memory (`MemAvailable`
///   minus 4 GiB) touched in 4 KiB pages and unmapped; then before each run
///   4 GiB of 4 KiB pages touched and unmapped. Free 2 MiB blocks are
///   scarce or reported to the host, so a fresh huge page faults on the
///   host too, while 4 KiB faults reuse backed fragments.
/// - `none`: no preparation; whatever the previous run left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Thp,
    Base4k,
    None,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Thp => "thp",
            State::Base4k => "4k",
            State::None => "none",
        }
    }
}

/// The states of a `--state` list (`thp,4k,none`).
pub fn parse_states(list: &str) -> Result<Vec<State>, String> {
    list.split(',')
        .map(|s| match s {
            "thp" => Ok(State::Thp),
            "4k" => Ok(State::Base4k),
            "none" => Ok(State::None),
            other => Err(format!("--state: {other:?} is not thp, 4k or none")),
        })
        .collect()
}

/// Bytes of 4 KiB pages touched and freed before each run in the `4k` state.
pub const STATE_4K_PER_RUN_MIB: usize = 4096;

/// The page size a preparation touches memory in.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    /// Advised `MADV_HUGEPAGE`.
    Huge,
    /// Advised `MADV_NOHUGEPAGE`.
    Base,
}

/// The preparation of `state` before one run.
pub fn prepare(state: State, prep_mib: usize) -> Result<(), String> {
    match state {
        State::Thp => touch_and_free(prep_mib, Pages::Huge),
        State::Base4k => touch_and_free(STATE_4K_PER_RUN_MIB, Pages::Base),
        State::None => Ok(()),
    }
}

/// The preparation of `state` once, before the first run.
pub fn prepare_once(state: State) -> Result<(), String> {
    if state == State::Base4k {
        let available = meminfo_mib("MemAvailable:").ok_or("no MemAvailable in /proc/meminfo")?;
        touch_and_free(available.saturating_sub(4096), Pages::Base)?;
    }
    Ok(())
}

/// A `/proc/meminfo` field in MiB.
pub fn meminfo_mib(key: &str) -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: usize = text
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024)
}

/// Map `mib` MiB of private anonymous memory advised for `pages`, write one
/// byte per 4 KiB page, unmap it (see [`DEFAULT_PREP_MIB`] and [`State`]).
pub fn touch_and_free(mib: usize, pages: Pages) -> Result<(), String> {
    if mib == 0 {
        return Ok(());
    }
    let len = mib
        .checked_mul(1 << 20)
        .ok_or(format!("preparation: {mib} MiB is too large"))?;
    // SAFETY: a fresh private anonymous mapping, written inside its length,
    // then unmapped whole.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(format!(
                "preparation: mmap of {mib} MiB failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        // Advice only: without THP the preparation stays in 4 KiB pages.
        let advice = match pages {
            Pages::Huge => libc::MADV_HUGEPAGE,
            Pages::Base => libc::MADV_NOHUGEPAGE,
        };
        libc::madvise(p, len, advice);
        let p = p.cast::<u8>();
        let mut i = 0;
        while i < len {
            p.add(i).write_volatile(1);
            i += 4096;
        }
        libc::munmap(p.cast(), len);
    }
    Ok(())
}

pub fn median(v: Vec<f64>) -> f64 {
    quantile(v, 0.5)
}

/// The `q` quantile of `v` (linear between the two nearest ranks).
pub fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// Whether this machine reports free memory to a host, as `ckalloc::probe`
/// sees it (a virtio-balloon device that negotiated free page reporting),
/// with the smallest order reported.
pub fn page_reporting() -> String {
    let p = ckalloc::probe();
    match (p.free_page_reporting, p.page_reporting_order) {
        (true, Some(o)) => format!("on, order {o}"),
        (true, None) => "on".into(),
        (false, _) => "off".into(),
    }
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Append one run to `path` as a line of JSON (`--records FILE` of the
/// drivers): the memory state, the contender, the round and the run's
/// values by key. `scripts/ab-stats` pairs a contender with its baseline
/// (`NAME@base`) round by round. An error is printed, not fatal.
pub fn record(
    path: Option<&str>,
    state: &str,
    contender: &str,
    round: usize,
    values: &[(&str, f64)],
) {
    use std::io::Write as _;
    let Some(path) = path else { return };
    let fields: Vec<String> = values
        .iter()
        .map(|(k, v)| {
            format!(
                "\"{k}\": {}",
                if v.is_finite() {
                    v.to_string()
                } else {
                    "null".into()
                }
            )
        })
        .collect();
    let line = format!(
        "{{\"state\": \"{state}\", \"contender\": \"{contender}\", \"round\": {round}, \"values\": {{{}}}}}\n",
        fields.join(", ")
    );
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!("records: {path}: {e}");
    }
}
