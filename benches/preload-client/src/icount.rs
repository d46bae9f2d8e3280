//! Instructions per small request, counted by callgrind: the small-request
//! loop (`small.c`: N pairs of `malloc(64)` + `free`) runs at N and at 2N
//! pairs, and the difference of callgrind's totals over N is the count of
//! one pair, start-up and exit cancelled out. callgrind counts
//! instructions, not time, so the count is the same on a busy host.

use std::process::Command;

/// Pairs in the shorter of the two runs.
pub const PAIRS: u64 = 100_000;

/// Instructions per `malloc(64)` + `free` pair: `run(n)` must give the
/// command that runs the loop with `n` pairs under
/// `valgrind --tool=callgrind`.
pub fn per_pair(run: impl Fn(u64) -> Command) -> Result<f64, String> {
    let total = |n: u64| -> Result<u64, String> {
        let out = run(n).output().map_err(|e| format!("valgrind: {e}"))?;
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return Err(format!("valgrind exited with {}: {err}", out.status));
        }
        // callgrind's summary line: "==PID== Collected : COUNT".
        err.lines()
            .find_map(|l| {
                l.split_once("Collected :")
                    .map(|(_, n)| n.trim().parse().ok())
            })
            .flatten()
            .ok_or_else(|| format!("no \"Collected :\" line from callgrind: {err}"))
    };
    let (short, long) = (total(PAIRS)?, total(2 * PAIRS)?);
    let diff = long
        .checked_sub(short)
        .ok_or("the longer run counted fewer instructions")?;
    Ok(diff as f64 / PAIRS as f64)
}
