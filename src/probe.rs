//! Seeing what you got: the system's huge-page state ([`probe`]) and how much
//! of a range is backed by huge pages ([`huge_page_coverage`]).

use crate::sys;
use crate::thp::{self, thp_settings, ThpSettings, THP_DEFRAG, THP_ENABLED};
use crate::units::human_bytes;
use std::ffi::CStr;
use std::fmt;
use std::io;

/// How much of an address range is resident, and how much of that is in huge
/// pages (THP or hugetlb).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HugeCoverage {
    /// Bytes of the range backed by a page (resident) right now.
    pub mapped_bytes: u64,
    /// Of those, bytes backed by huge pages (THP or hugetlb).
    pub huge_bytes: u64,
    /// `true` when measured page by page over exactly the range
    /// (`PAGEMAP_SCAN`); `false` when read from `/proc/self/smaps`, which
    /// reports whole VMAs: a VMA that extends past the range counts whole.
    pub exact: bool,
}

impl HugeCoverage {
    /// `huge_bytes / mapped_bytes`, or 0.0 when nothing is resident.
    pub fn fraction(&self) -> f64 {
        if self.mapped_bytes == 0 {
            0.0
        } else {
            self.huge_bytes as f64 / self.mapped_bytes as f64
        }
    }
}

impl fmt::Display for HugeCoverage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} resident, {} in huge pages ({:.1}%{})",
            human_bytes(self.mapped_bytes),
            human_bytes(self.huge_bytes),
            100.0 * self.fraction(),
            if self.exact { "" } else { ", per VMA" }
        )
    }
}

/// Measure huge-page coverage of `ptr..ptr+len` in this process.
///
/// Uses the `PAGEMAP_SCAN` ioctl with `PAGE_IS_HUGE` (Linux 6.7+,
/// `sys::LINUX_PAGEMAP_SCAN`), which
/// measures exactly the range; on older kernels falls back to
/// `/proc/self/smaps` at VMA granularity and says so in
/// [`HugeCoverage::exact`]. Reading does not fault pages in.
///
/// # Errors
/// The I/O error of opening `/proc/self/pagemap` or `/proc/self/smaps`.
pub fn huge_page_coverage(ptr: *const u8, len: usize) -> io::Result<HugeCoverage> {
    let start = ptr as u64;
    let end = start
        .checked_add(len as u64)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let page = sys::page_size() as u64;
    let (start_p, end_p) = (start & !(page - 1), (end + page - 1) & !(page - 1));
    let mut cov = HugeCoverage {
        exact: true,
        ..HugeCoverage::default()
    };
    if !sys::linux_at_least(sys::LINUX_PAGEMAP_SCAN) {
        return smaps_coverage(start, end);
    }
    let scan = sys::pagemap_scan(start_p, end_p, |run| {
        let (s, e) = (run.start.max(start), run.end.min(end));
        if e > s {
            cov.mapped_bytes += e - s;
            if run.huge {
                cov.huge_bytes += e - s;
            }
        }
    });
    match scan {
        Ok(()) => Ok(cov),
        Err(_) => smaps_coverage(start, end),
    }
}

fn smaps_coverage(start: u64, end: u64) -> io::Result<HugeCoverage> {
    let text = std::fs::read_to_string("/proc/self/smaps")?;
    let mut cov = HugeCoverage::default();
    let mut inside = false;
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let first = parts.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                inside = a < end && b > start;
                continue;
            }
        }
        if !inside {
            continue;
        }
        let kb = parts
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024;
        match first {
            "Rss:" => cov.mapped_bytes += kb,
            "AnonHugePages:" | "FilePmdMapped:" => cov.huge_bytes += kb,
            "Private_Hugetlb:" | "Shared_Hugetlb:" => {
                cov.mapped_bytes += kb;
                cov.huge_bytes += kb;
            }
            _ => {}
        }
    }
    Ok(cov)
}

/// hugetlb pages of one size, from `/sys/kernel/mm/hugepages/`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HugetlbPool {
    /// Page size in bytes (2 MiB, 1 GiB).
    pub page_size: u64,
    /// Pages reserved in the pool (`nr_hugepages`).
    pub total: u64,
    /// Pages not in use (`free_hugepages`).
    pub free: u64,
}

/// The system's huge-page configuration, as [`probe`] read it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SystemHugePages {
    /// THP mode from `/sys/kernel/mm/transparent_hugepage/enabled`
    /// (`always`, `madvise`, `never`), `None` if the kernel has no THP.
    pub thp_enabled: Option<String>,
    /// THP defrag mode from `.../transparent_hugepage/defrag`.
    pub thp_defrag: Option<String>,
    /// The `defrag` mode as a value, and khugepaged's settings.
    pub thp: ThpSettings,
    /// hugetlb pools, one per supported page size, smallest first.
    pub hugetlb: Vec<HugetlbPool>,
    /// Base page size in bytes.
    pub base_page_size: u64,
    /// `RLIMIT_MEMLOCK` soft limit in bytes (`None`: unlimited or unknown).
    pub memlock_soft: Option<u64>,
    /// `RLIMIT_MEMLOCK` hard limit in bytes (`None`: unlimited or unknown).
    pub memlock_hard: Option<u64>,
    /// Whether this machine reports free memory to a host: a virtio-balloon
    /// device bound to its driver negotiated free page reporting
    /// (`VIRTIO_BALLOON_F_REPORTING`, feature bit 5 in
    /// `/sys/bus/virtio/drivers/virtio_balloon/*/features`). The guest then
    /// hands free blocks of at least `2^page_reporting_order` base pages
    /// back to the host (Linux's `mm/page_reporting.c`), and a page taken
    /// from such a block faults on the host too: fresh huge pages cost more
    /// to touch than on bare metal.
    pub free_page_reporting: bool,
    /// The smallest order of blocks reported
    /// (`/sys/module/page_reporting/parameters/page_reporting_order`; 9 is
    /// 2 MiB with 4 KiB pages), `None` when the kernel has no free page
    /// reporting.
    pub page_reporting_order: Option<u32>,
}

impl SystemHugePages {
    /// The pool of `page_size` bytes, if the kernel supports that size.
    pub fn pool(&self, page_size: u64) -> Option<&HugetlbPool> {
        self.hugetlb.iter().find(|p| p.page_size == page_size)
    }
}

fn read_choice(path: &CStr) -> Option<String> {
    let mut buf = [0u8; 128];
    thp::sysfs_choice(path, &mut buf).map(|w| String::from_utf8_lossy(w).into_owned())
}

fn read_u64(path: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Whether a virtio-balloon device negotiated `VIRTIO_BALLOON_F_REPORTING`
/// (bit 5 of the `features` string of 0s and 1s, bit 0 first).
fn balloon_reports_free_pages() -> bool {
    const VIRTIO_BALLOON_F_REPORTING: usize = 5;
    let Ok(dir) = std::fs::read_dir("/sys/bus/virtio/drivers/virtio_balloon") else {
        return false;
    };
    dir.flatten().any(|e| {
        std::fs::read(e.path().join("features"))
            .is_ok_and(|f| f.get(VIRTIO_BALLOON_F_REPORTING) == Some(&b'1'))
    })
}

/// Read the system's huge-page state: THP modes, hugetlb pools per page size,
/// the base page size, `RLIMIT_MEMLOCK` and free page reporting. Reads
/// sysfs; changes nothing.
pub fn probe() -> SystemHugePages {
    let mut hugetlb = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/sys/kernel/mm/hugepages") {
        for entry in dir.flatten() {
            let name = entry.file_name();
            let Some(kb) = name
                .to_str()
                .and_then(|n| n.strip_prefix("hugepages-"))
                .and_then(|n| n.strip_suffix("kB"))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            let p = entry.path();
            hugetlb.push(HugetlbPool {
                page_size: kb * 1024,
                total: read_u64(&p.join("nr_hugepages")).unwrap_or(0),
                free: read_u64(&p.join("free_hugepages")).unwrap_or(0),
            });
        }
    }
    hugetlb.sort_by_key(|p| p.page_size);
    let (memlock_soft, memlock_hard) = sys::memlock_limit().unwrap_or((None, None));
    SystemHugePages {
        thp_enabled: read_choice(THP_ENABLED),
        thp_defrag: read_choice(THP_DEFRAG),
        thp: thp_settings(),
        hugetlb,
        base_page_size: sys::page_size() as u64,
        memlock_soft,
        memlock_hard,
        free_page_reporting: balloon_reports_free_pages(),
        page_reporting_order: read_u64(std::path::Path::new(
            "/sys/module/page_reporting/parameters/page_reporting_order",
        ))
        .and_then(|o| u32::try_from(o).ok()),
    }
}

impl fmt::Display for SystemHugePages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.thp_enabled {
            Some(_) => writeln!(f, "THP:             {}", self.thp)?,
            None => writeln!(f, "THP:             unsupported")?,
        }
        writeln!(f, "base page size:  {}", human_bytes(self.base_page_size))?;
        for p in &self.hugetlb {
            writeln!(
                f,
                "hugetlb {:>9}: {} reserved, {} free",
                human_bytes(p.page_size),
                p.total,
                p.free
            )?;
        }
        if self.hugetlb.is_empty() {
            writeln!(f, "hugetlb:         unsupported")?;
        }
        let lim = |v: Option<u64>| {
            v.map_or_else(|| "unlimited".to_string(), |b| human_bytes(b).to_string())
        };
        writeln!(
            f,
            "RLIMIT_MEMLOCK:  soft {}, hard {}",
            lim(self.memlock_soft),
            lim(self.memlock_hard)
        )?;
        match (self.free_page_reporting, self.page_reporting_order) {
            (true, Some(o)) => write!(
                f,
                "free page reporting: on (virtio-balloon, blocks of order {o} and up go back to the host)"
            ),
            (true, None) => write!(f, "free page reporting: on (virtio-balloon)"),
            (false, _) => write!(f, "free page reporting: off"),
        }
    }
}
