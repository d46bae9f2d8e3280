//! First touch of a 64 MiB block under `CkHuge::new()` (its first-touch
//! probe), under `CkHuge::new()` with the engine's background thread
//! (`enable_background_thread()`: base pages first, promoted with
//! `MADV_COLLAPSE`; `ckhuge-promote`) and under `System` (glibc), in each
//! memory state, with and without one CPU-bound process per core running
//! (two on the 2-core machine measured): the time to allocate and write one
//! byte per 4 KiB page, the share of the block in huge pages right after
//! and 2 s after the first touch began (`huge_page_coverage`), and the
//! probe's decision (pages that cost more than 1 ms; pages slow only by the
//! wall clock, which the probe takes for a busy CPU, not for slow memory).
//!
//! ```text
//! first-touch [--rounds N] [--state thp,4k,none] [--prep-mib M] [--idle-ms T] [--records FILE]
//! ```
//!
//! `--idle-ms T` waits T ms between the preparation and the run: on a VM
//! with free page reporting the memory freed by the preparation goes back to
//! the host meanwhile (Linux reports free blocks about 2 s after they are
//! freed), so fresh huge pages fault on the host too.
//!
//! `--records FILE` appends every run as a line of JSON (state `STATE-idle`
//! or `STATE-busy`), as the other drivers do.
//!
//! Every run is a fresh process (`first-touch --child ALLOC`), preceded by
//! the preparation of its memory state; the contenders and the load run
//! interleaved within a round. The CPU-bound processes are children
//! (`first-touch --spin`, one per core) started before the preparation and
//! killed after the run, or by the kernel when the driver dies
//! (`PR_SET_PDEATHSIG`). Prints every run, then per state and load the medians and how
//! many runs kept the block at least 95% huge.

#[path = "../memory_state.rs"]
mod memory_state;

use ckalloc::{huge_page_coverage, huge_stats, CkHuge};
use memory_state::{
    loadavg, median, page_reporting, parse_states, prepare, prepare_once, record, State,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Instant;

const BLOCK: usize = 64 << 20;

/// One run's result, as the child prints it.
#[derive(Clone, Copy, Default)]
struct Run {
    ms: f64,
    huge_pct: f64,
    huge_2s_pct: f64,
    slow_blocks: f64,
    wall_only_pages: f64,
    cpu_wait_ms: f64,
}

fn child(alloc: &str) -> ExitCode {
    let layout = Layout::from_size_align(BLOCK, 64).expect("64 MiB layout");
    let ckhuge = CkHuge::new();
    if alloc == "ckhuge-promote" {
        ckalloc::huge::enable_background_thread();
    }
    let before = huge_stats();
    let start = Instant::now();
    // SAFETY: a non-zero layout; the block is written inside its length and
    // freed with the same allocator and layout below.
    let p = unsafe {
        match alloc {
            "ckhuge" | "ckhuge-promote" => ckhuge.alloc(layout),
            "system" => System.alloc(layout),
            other => {
                eprintln!("first-touch: --child {other:?}: not ckhuge, ckhuge-promote or system");
                return ExitCode::from(2);
            }
        }
    };
    if p.is_null() {
        eprintln!("first-touch: allocation failed");
        return ExitCode::FAILURE;
    }
    let mut i = 0;
    while i < BLOCK {
        // SAFETY: `i < BLOCK`, inside the block.
        unsafe { p.add(i).write_volatile(1) };
        i += 4096;
    }
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let pct = || {
        huge_page_coverage(p, BLOCK)
            .ok()
            .map_or(f64::NAN, |c| 100.0 * c.huge_bytes as f64 / BLOCK as f64)
    };
    let huge_pct = pct();
    let after = huge_stats();
    std::thread::sleep(std::time::Duration::from_secs(2).saturating_sub(start.elapsed()));
    let huge_2s_pct = pct();
    // SAFETY: allocated above with this allocator and layout.
    unsafe {
        match alloc {
            "system" => System.dealloc(p, layout),
            _ => ckhuge.dealloc(p, layout),
        }
    }
    println!(
        "RESULT ms={ms:.2} huge_pct={huge_pct:.1} huge_2s_pct={huge_2s_pct:.1} slow_blocks={} wall_only_pages={} cpu_wait_ms={:.2}",
        after.first_touch_slow_probes - before.first_touch_slow_probes,
        after.first_touch_descheduled_pages - before.first_touch_descheduled_pages,
        (after.first_touch_cpu_wait_ns - before.first_touch_cpu_wait_ns) as f64 / 1e6
    );
    ExitCode::SUCCESS
}

fn parse(line: &str) -> Option<Run> {
    let rest = line.strip_prefix("RESULT ")?;
    let mut r = Run::default();
    for kv in rest.split_whitespace() {
        let (k, v) = kv.split_once('=')?;
        let v: f64 = v.parse().ok()?;
        match k {
            "ms" => r.ms = v,
            "huge_pct" => r.huge_pct = v,
            "huge_2s_pct" => r.huge_2s_pct = v,
            "slow_blocks" => r.slow_blocks = v,
            "wall_only_pages" => r.wall_only_pages = v,
            "cpu_wait_ms" => r.cpu_wait_ms = v,
            _ => {}
        }
    }
    Some(r)
}

/// Kill and reap every process of `children`.
fn stop(children: Vec<Child>) {
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// `n` CPU-bound children; on a failure, none.
fn spinners(n: usize) -> Result<Vec<Child>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children = Vec::new();
    for _ in 0..n {
        match Command::new(&exe)
            .arg("--spin")
            .stdout(Stdio::null())
            .spawn()
        {
            Ok(c) => children.push(c),
            Err(e) => {
                stop(children);
                return Err(format!("spawning a CPU-bound process: {e}"));
            }
        }
    }
    Ok(children)
}

/// A CPU-bound child: spins until killed, and is killed with its parent.
fn spin() -> ! {
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number; no memory
    // is passed.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    loop {
        std::hint::spin_loop();
    }
}

const USAGE: &str = "usage: first-touch [--rounds N] [--state thp,4k,none] [--prep-mib M] \
                     [--idle-ms T] [--records FILE]";

fn run_once(alloc: &str) -> Result<Run, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new(exe)
        .args(["--child", alloc])
        .env("CKALLOC_HUGETLB", "0")
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(parse)
        .filter(|_| out.status.success())
        .ok_or_else(|| {
            format!(
                "first-touch child under {alloc} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--spin") => spin(),
        Some("--child") => return child(args.get(1).map_or("", String::as_str)),
        Some("--help" | "-h") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    let mut rounds = 9;
    let mut states = vec![State::Thp, State::Base4k, State::None];
    let mut prep_mib = memory_state::DEFAULT_PREP_MIB;
    let mut records = None;
    let mut idle_ms = 0u64;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let Some(v) = it.next().map(String::as_str) else {
            eprintln!("first-touch: {a} needs a value (or is not an option)\n{USAGE}");
            return ExitCode::from(2);
        };
        let number = |what: &str| v.parse::<u64>().map_err(|_| format!("{a} {v:?}: {what}"));
        let parsed = match a.as_str() {
            "--rounds" => number("a number of rounds from 1")
                .and_then(|n| usize::try_from(n).map_err(|e| e.to_string()))
                .and_then(|n| match n {
                    0 => Err(format!("{a} 0: a number of rounds from 1")),
                    n => {
                        rounds = n;
                        Ok(())
                    }
                }),
            "--state" => parse_states(v).map(|s| states = s),
            "--prep-mib" => number("MiB, a whole number")
                .and_then(|n| usize::try_from(n).map_err(|e| e.to_string()))
                .map(|n| prep_mib = n),
            "--idle-ms" => number("milliseconds, a whole number").map(|n| idle_ms = n),
            "--records" => {
                records = Some(v.to_string());
                Ok(())
            }
            _ => Err(format!("unknown argument {a:?}")),
        };
        if let Err(e) = parsed {
            eprintln!("first-touch: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    println!(
        "first-touch: 64 MiB, {rounds} rounds, {idle_ms} ms idle after each preparation, free page reporting {}, load average {}",
        page_reporting(),
        loadavg()
    );
    let contenders = ["ckhuge", "ckhuge-promote", "system"];
    for state in states {
        if let Err(e) = prepare_once(state) {
            eprintln!("first-touch: {e}");
            return ExitCode::FAILURE;
        }
        // results[load][contender]
        let mut results = vec![vec![Vec::new(); contenders.len()]; 2];
        println!();
        println!("state {}:", state.name());
        println!(
            "round load     allocator       ms      huge %  at 2 s  slow block  wall-only pages  CPU wait ms"
        );
        for round in 0..rounds {
            for k in 0..2 * contenders.len() {
                let slot = (round + k) % (2 * contenders.len());
                let (load, c) = (slot / contenders.len(), slot % contenders.len());
                let busy = match spinners(cores * load) {
                    Ok(b) => b,
                    Err(e) => {
                        eprintln!("first-touch: {e}");
                        return ExitCode::FAILURE;
                    }
                };
                let result = prepare(state, prep_mib).and_then(|()| {
                    std::thread::sleep(std::time::Duration::from_millis(idle_ms));
                    run_once(contenders[c])
                });
                stop(busy);
                let r = match result {
                    Ok(r) => r,
                    Err(e) => {
                        eprintln!("first-touch: {e}");
                        return ExitCode::FAILURE;
                    }
                };
                println!(
                    "{:<5} {:<8} {:<15} {:<7.1} {:<7.1} {:<7.1} {:<11} {:<16} {:.1}",
                    round + 1,
                    if load == 1 { "busy" } else { "idle" },
                    contenders[c],
                    r.ms,
                    r.huge_pct,
                    r.huge_2s_pct,
                    r.slow_blocks,
                    r.wall_only_pages,
                    r.cpu_wait_ms
                );
                record(
                    records.as_deref(),
                    &format!(
                        "{}-{}",
                        state.name(),
                        if load == 1 { "busy" } else { "idle" }
                    ),
                    contenders[c],
                    round + 1,
                    &[
                        ("first_touch_ms", r.ms),
                        ("huge_pct", r.huge_pct),
                        ("huge_2s_pct", r.huge_2s_pct),
                        ("slow_blocks", r.slow_blocks),
                        ("wall_only_pages", r.wall_only_pages),
                        ("cpu_wait_ms", r.cpu_wait_ms),
                    ],
                );
                results[load][c].push(r);
            }
        }
        println!();
        println!(
            "| state | load | allocator | first touch ms (median) | huge % (median) | runs >= 95% huge | huge % at 2 s (median) | runs >= 95% huge at 2 s | runs with a slow page | wall-only slow pages (sum) |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        for (load, per) in results.iter().enumerate() {
            for (c, runs) in per.iter().enumerate() {
                let col = |f: fn(&Run) -> f64| runs.iter().map(f).collect::<Vec<_>>();
                println!(
                    "| {} | {} | {} | {:.1} | {:.1} | {} of {} | {:.1} | {} of {} | {} | {} |",
                    state.name(),
                    if load == 1 {
                        "a CPU-bound process per core"
                    } else {
                        "idle"
                    },
                    contenders[c],
                    median(col(|r| r.ms)),
                    median(col(|r| r.huge_pct)),
                    runs.iter().filter(|r| r.huge_pct >= 95.0).count(),
                    runs.len(),
                    median(col(|r| r.huge_2s_pct)),
                    runs.iter().filter(|r| r.huge_2s_pct >= 95.0).count(),
                    runs.len(),
                    runs.iter().filter(|r| r.slow_blocks > 0.0).count(),
                    col(|r| r.wall_only_pages).iter().sum::<f64>()
                );
            }
        }
    }
    ExitCode::SUCCESS
}
