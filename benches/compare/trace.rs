//! Row 8: replay of a real inference program's allocation trace.
//!
//! `benches/data/minilm-trace.bin.gz` holds every `alloc`, `alloc_zeroed`,
//! `dealloc` and `realloc` (size and alignment, small requests included) of
//! candle's `BertModel` loading all-MiniLM-L6-v2 and running 5 forward
//! passes of a 16 x 128 batch, recorded by `minilm-record` in
//! `benches/real-client` (its `record` module documents the format). The
//! replay issues the same requests, in the recorded order, on one thread,
//! through `GlobalAlloc` on `System` (glibc), mimalloc and `CkHuge::new()`
//! called directly, and writes one byte per 4 KiB page of every new block
//! (and of the grown part of a reallocated block): the program's first
//! touch of its memory is the cost this pattern pays.
//!
//! Each repetition runs the three in rotating order. Only the replay itself
//! is timed; afterwards the blocks still live are freed and every allocator
//! gives back what it retains (`malloc_trim(0)` for glibc, which also serves
//! `CkHuge`'s small requests, `mi_collect(true)` for mimalloc and
//! `ckalloc::release_retained()` for `CkHuge`'s retention cache), so every
//! repetition starts from the same state.

use crate::{fmt_dur, median, Row};
use ckalloc::CkHuge;
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Read;
use std::ptr;
use std::time::Instant;

/// The trace file, relative to the repository root.
pub const TRACE: &str = "benches/data/minilm-trace.bin.gz";

/// One request of the trace; blocks are named by allocation order.
#[derive(Debug, Clone, Copy)]
enum Op {
    Alloc {
        size: usize,
        align: usize,
        zeroed: bool,
    },
    Free {
        id: usize,
    },
    Realloc {
        id: usize,
        size: usize,
    },
}

/// A decoded trace.
struct Trace {
    ops: Vec<Op>,
    allocs: usize,
    /// Bytes requested by allocations and growing reallocs.
    bytes: u64,
}

fn leb(data: &[u8], pos: &mut usize) -> Result<u64, String> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let b = *data.get(*pos).ok_or("truncated LEB128 field")?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("LEB128 field longer than 64 bits".into())
}

fn usize_of(v: u64) -> Result<usize, String> {
    usize::try_from(v).map_err(|_| format!("value {v} does not fit usize"))
}

/// Decode the trace format (uncompressed), checking that every block id
/// names a live block and every layout is valid.
fn decode(data: &[u8]) -> Result<Trace, String> {
    let body = data
        .strip_prefix(b"CKTRACE1")
        .ok_or("not a CKTRACE1 file")?;
    let mut pos = 0;
    let mut ops = Vec::new();
    let mut live: Vec<Option<(usize, usize)>> = Vec::new();
    let mut bytes = 0u64;
    let id_of = |age: u64, live: &Vec<Option<(usize, usize)>>| -> Result<usize, String> {
        let age = usize_of(age)?;
        let id = live
            .len()
            .checked_sub(1 + age)
            .ok_or_else(|| format!("block age {age} before the first block"))?;
        if live[id].is_none() {
            return Err(format!("block {id} is not live"));
        }
        Ok(id)
    };
    while pos < body.len() {
        let tag = body[pos];
        pos += 1;
        match tag {
            0 | 1 => {
                let size = usize_of(leb(body, &mut pos)?)?;
                let log2 = *body.get(pos).ok_or("truncated alloc record")?;
                pos += 1;
                let align = 1usize
                    .checked_shl(u32::from(log2))
                    .ok_or("alignment out of range")?;
                Layout::from_size_align(size, align).map_err(|e| e.to_string())?;
                if size == 0 {
                    return Err("zero-size allocation".into());
                }
                ops.push(Op::Alloc {
                    size,
                    align,
                    zeroed: tag == 1,
                });
                live.push(Some((size, align)));
                bytes += size as u64;
            }
            2 => {
                let id = id_of(leb(body, &mut pos)?, &live)?;
                live[id] = None;
                ops.push(Op::Free { id });
            }
            3 => {
                let id = id_of(leb(body, &mut pos)?, &live)?;
                let size = usize_of(leb(body, &mut pos)?)?;
                let (old, align) = live[id].ok_or("realloc of a dead block")?;
                Layout::from_size_align(size, align).map_err(|e| e.to_string())?;
                if size == 0 {
                    return Err("realloc to zero bytes".into());
                }
                live[id] = Some((size, align));
                bytes += size.saturating_sub(old) as u64;
                ops.push(Op::Realloc { id, size });
            }
            4 => {
                let phase = *body.get(pos).ok_or("truncated mark")?;
                pos += 1;
                if phase == 1 {
                    leb(body, &mut pos)?;
                }
            }
            t => return Err(format!("unknown record tag {t}")),
        }
    }
    Ok(Trace {
        allocs: live.len(),
        ops,
        bytes,
    })
}

fn load() -> Result<Trace, String> {
    let path = crate::repo_path(TRACE);
    let file = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(file)
        .read_to_end(&mut raw)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    decode(&raw)
}

/// Write one byte per 4 KiB page of `p[from..to]`.
///
/// # Safety
/// `p..p+to` is writable.
unsafe fn touch(p: *mut u8, from: usize, to: usize) {
    let mut i = from;
    while i < to {
        // SAFETY: `i < to`, inside the block.
        unsafe { p.add(i).write_volatile(1) };
        i += 4096;
    }
}

/// A live block of the replay.
#[derive(Clone, Copy)]
struct Block {
    ptr: *mut u8,
    size: usize,
    align: usize,
}

const DEAD: Block = Block {
    ptr: ptr::null_mut(),
    size: 0,
    align: 1,
};

/// Replay `t` through `g`; returns the nanoseconds the requests took. The
/// blocks still live at the end are freed after the clock stops.
fn replay<G: GlobalAlloc>(g: &G, t: &Trace, blocks: &mut Vec<Block>) -> f64 {
    blocks.clear();
    blocks.reserve(t.allocs);
    let start = Instant::now();
    for op in &t.ops {
        match *op {
            Op::Alloc {
                size,
                align,
                zeroed,
            } => {
                // SAFETY: `decode` checked the layout (non-zero size).
                let l = unsafe { Layout::from_size_align_unchecked(size, align) };
                // SAFETY: non-zero size.
                let p = unsafe {
                    if zeroed {
                        g.alloc_zeroed(l)
                    } else {
                        g.alloc(l)
                    }
                };
                assert!(!p.is_null(), "allocation of {size} bytes failed");
                // SAFETY: the block holds `size` bytes.
                unsafe { touch(p, 0, size) };
                blocks.push(Block {
                    ptr: p,
                    size,
                    align,
                });
            }
            Op::Free { id } => {
                let b = std::mem::replace(&mut blocks[id], DEAD);
                // SAFETY: `decode` checked the block is live; allocated by
                // `g` with this layout.
                unsafe { g.dealloc(b.ptr, Layout::from_size_align_unchecked(b.size, b.align)) };
            }
            Op::Realloc { id, size } => {
                let b = blocks[id];
                // SAFETY: live block of `g` with this layout; `decode`
                // checked the new size is valid for the alignment.
                let p = unsafe {
                    g.realloc(
                        b.ptr,
                        Layout::from_size_align_unchecked(b.size, b.align),
                        size,
                    )
                };
                assert!(!p.is_null(), "reallocation to {size} bytes failed");
                // SAFETY: the block holds `size` bytes.
                unsafe { touch(p, b.size, size) };
                blocks[id] = Block { ptr: p, size, ..b };
            }
        }
    }
    let ns = start.elapsed().as_nanos() as f64;
    for b in blocks.iter().filter(|b| !b.ptr.is_null()) {
        // SAFETY: a live block of `g` with its layout.
        unsafe { g.dealloc(b.ptr, Layout::from_size_align_unchecked(b.size, b.align)) };
    }
    blocks.clear();
    ns
}

/// Give back what glibc, mimalloc and `CkHuge` retain.
fn release_all() {
    // SAFETY: plain libc and mimalloc calls without pointer arguments.
    unsafe {
        libc::malloc_trim(0);
        libmimalloc_sys::mi_collect(true);
    }
    ckalloc::release_retained();
}

pub fn replay_rows(full: bool) -> Vec<Row> {
    let reps = if full { 9 } else { 5 };
    let t = match load() {
        Ok(t) => t,
        Err(e) => {
            return vec![Row {
                name: "8. MiniLM trace replay".into(),
                ours: "-".into(),
                peer: "-".into(),
                ratio: f64::NAN,
                target: format!("skipped: {e}"),
                met: false,
            }]
        }
    };
    let ck = CkHuge::new();
    let mi = mimalloc::MiMalloc;
    let mut blocks = Vec::with_capacity(t.allocs);
    // Warm-up: one replay each, so that code and page tables of the
    // replay itself are in place.
    replay(&System, &t, &mut blocks);
    replay(&mi, &t, &mut blocks);
    replay(&ck, &t, &mut blocks);
    release_all();
    let (mut sy, mut mm, mut ch) = (vec![], vec![], vec![]);
    for r in 0..reps {
        for k in 0..3 {
            match (r + k) % 3 {
                0 => sy.push(replay(&System, &t, &mut blocks)),
                1 => mm.push(replay(&mi, &t, &mut blocks)),
                _ => ch.push(replay(&ck, &t, &mut blocks)),
            }
            release_all();
        }
    }
    let r_mi: Vec<f64> = mm.iter().zip(&ch).map(|(p, o)| p / o).collect();
    let r_sy: Vec<f64> = sy.iter().zip(&ch).map(|(p, o)| p / o).collect();
    let ch_m = median(ch);
    let what = format!(
        "8. MiniLM trace replay ({} requests, {:.1} GiB requested)",
        t.ops.len(),
        t.bytes as f64 / (1u64 << 30) as f64
    );
    let r_mi = median(r_mi);
    let r_sy = median(r_sy);
    vec![
        Row {
            name: format!("{what}: CkHuge::new() vs mimalloc"),
            ours: fmt_dur(ch_m),
            peer: fmt_dur(median(mm)),
            ratio: r_mi,
            target: ">= 1.0x (<= 1.0x time)".into(),
            met: r_mi >= 1.0,
        },
        Row {
            name: format!("{what}: CkHuge::new() vs System"),
            ours: fmt_dur(ch_m),
            peer: fmt_dur(median(sy)),
            ratio: r_sy,
            target: "(report)".into(),
            met: true,
        },
    ]
}
