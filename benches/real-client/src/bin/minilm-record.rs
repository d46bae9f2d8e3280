//! all-MiniLM-L6-v2 under a recording allocator: writes the run's
//! allocation trace, gzip-compressed, to `--out FILE` (default
//! `benches/data/minilm-trace.bin.gz`). See `ckalloc_real_client::record`.

use ckalloc_real_client::record::{self, Recorder};
use ckalloc_real_client::{print_report, run, Options};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

#[global_allocator]
static A: Recorder = Recorder;

fn main() -> ExitCode {
    let opts = match Options::from_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("minilm-record: {e}");
            return ExitCode::from(2);
        }
    };
    let report = match run(&opts, &record::mark) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("minilm-record: {e}");
            return ExitCode::FAILURE;
        }
    };
    let events = match record::stop() {
        Ok(ev) => ev,
        Err(cap) => {
            eprintln!("minilm-record: more than {cap} events; raise record::CAPACITY");
            return ExitCode::FAILURE;
        }
    };
    print_report("record", &opts, &report);
    let (raw, s) = match record::encode(events) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("minilm-record: {e}");
            return ExitCode::FAILURE;
        }
    };
    let out = opts.out.clone().unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/minilm-trace.bin.gz")
    });
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let gz = gz.write_all(&raw).and_then(|()| gz.finish());
    let written = gz.and_then(|bytes| {
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&out, &bytes).map(|()| bytes.len())
    });
    match written {
        Ok(n) => {
            println!(
                "trace: {} events, {} allocs ({} of 2 MiB or more, {:.1} MiB of {:.1} MiB requested), {} frees, {} reallocs, peak live {:.1} MiB, {} blocks live at the end",
                events.len(),
                s.allocs,
                s.allocs_2m,
                s.bytes_2m as f64 / 1048576.0,
                s.bytes as f64 / 1048576.0,
                s.frees,
                s.reallocs,
                s.peak_live as f64 / 1048576.0,
                s.live_at_end
            );
            println!(
                "trace: {} bytes raw, {} bytes gzip, written to {}",
                raw.len(),
                n,
                out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("minilm-record: {}: {e}", out.display());
            ExitCode::FAILURE
        }
    }
}
