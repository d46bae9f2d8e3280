//! First-touch time vs size for 4 KiB, THP and hugetlb pages, written as an
//! SVG with `plotters` (`-- --plot FILE`; the pseudo-row `sweep` runs it
//! alone). hugetlb points need reserved 2 MiB pages
//! (`/proc/sys/vm/nr_hugepages`); without them that series is left out.

use crate::{fmt_dur, median, Row};
use plotters::prelude::*;
use std::hint::black_box;
use std::sync::OnceLock;
use std::time::Instant;

const MIB: usize = 1 << 20;

/// Where `--plot` writes the SVG.
pub static PATH: OnceLock<String> = OnceLock::new();

#[derive(Clone, Copy)]
enum Kind {
    Small,
    Thp,
    Hugetlb,
}

/// Time to map `size` bytes of `kind` and write one byte per 4 KiB, in ns;
/// `None` if the mapping fails (no hugetlb pages reserved).
fn first_touch(size: usize, kind: Kind) -> Option<f64> {
    let t = Instant::now();
    let (ptr, len) = match kind {
        Kind::Hugetlb => {
            // SAFETY: plain anonymous hugetlb mapping; checked below.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return None;
            }
            (p.cast::<u8>(), size)
        }
        _ => {
            let mut r = crate::pages::Raw::new(size, matches!(kind, Kind::Thp));
            let s = r.slice();
            for i in (0..s.len()).step_by(4096) {
                s[i] = 1;
            }
            black_box(&r);
            let e = t.elapsed();
            drop(r);
            return Some(e.as_nanos() as f64);
        }
    };
    // SAFETY: `len` bytes mapped read-write at `ptr`.
    let s = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
    for i in (0..len).step_by(4096) {
        s[i] = 1;
    }
    black_box(&s);
    let e = t.elapsed();
    // SAFETY: our mapping, a multiple of 2 MiB long.
    unsafe { libc::munmap(ptr.cast(), len) };
    Some(e.as_nanos() as f64)
}

/// The sweep; prints its data and writes the SVG when `--plot` was given.
pub fn sweep(full: bool) -> Vec<Row> {
    let sizes: Vec<usize> = if full {
        vec![2, 8, 32, 128, 512, 1024]
    } else {
        vec![2, 8, 32, 128, 512]
    };
    let reps = 5;
    let kinds = [
        ("4 KiB pages", Kind::Small),
        ("THP (2 MiB)", Kind::Thp),
        ("hugetlb (2 MiB)", Kind::Hugetlb),
    ];
    // Warm up (host faults in a VM).
    for _ in 0..2 {
        first_touch(sizes[sizes.len() - 1] * MIB, Kind::Small);
        first_touch(sizes[sizes.len() - 1] * MIB, Kind::Thp);
    }
    let mut series: Vec<(&str, Vec<(f64, f64)>)> = kinds.iter().map(|k| (k.0, vec![])).collect();
    println!("first touch (median of {reps}):");
    for &mib in &sizes {
        let mut line = format!("  {mib:>5} MiB:");
        for (i, (name, kind)) in kinds.iter().enumerate() {
            let v: Vec<f64> = (0..reps)
                .filter_map(|_| first_touch(mib * MIB, *kind))
                .collect();
            if v.len() == reps {
                let m = median(v);
                line += &format!("  {name} {}", fmt_dur(m));
                series[i].1.push((mib as f64, m / 1e6));
            } else {
                line += &format!("  {name} n/a");
            }
        }
        println!("{line}");
    }
    if let Some(path) = PATH.get() {
        draw(path, &series).expect("write plot");
        println!("plot written to {path}");
    }
    vec![]
}

fn draw(path: &str, series: &[(&str, Vec<(f64, f64)>)]) -> Result<(), Box<dyn std::error::Error>> {
    let xmax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .fold(2.0, f64::max);
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(0.01, f64::max);
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "First touch (map + write 1 B per 4 KiB)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (1.0..xmax * 1.5).log_scale(),
            (0.001..ymax * 2.0).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("size (MiB)")
        .y_desc("time (ms)")
        .draw()?;
    let colors = [RED, BLUE, GREEN];
    for ((name, pts), color) in series.iter().zip(colors) {
        if pts.is_empty() {
            continue;
        }
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
