//! Byte counts for people: [`human_bytes`].

/// Format a byte count with a binary unit: whole bytes below 1 KiB
/// (`512 B`), else two decimals of the largest unit from KiB to PiB that
/// keeps the number at least 1 (`1.50 GiB`; units of 1024 bytes).
///
/// ```
/// assert_eq!(ckalloc::human_bytes(512), "512 B");
/// assert_eq!(ckalloc::human_bytes(3 << 29), "1.50 GiB");
/// ```
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}
