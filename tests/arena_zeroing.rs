//! Memory that reads zero in an arena built with `release_on_reset(true)`:
//! after `reset()` or `rewind_to()` every freed runtime byte reads zero, up
//! to the high-water mark, on every backing (base pages, THP, 2 MiB and
//! 1 GiB hugetlb pages), with region boundaries that are not page aligned,
//! in both modes. The bytes of the weights region, including the part of a
//! page it shares with the runtime region, stay as they were.
//! (Injected `madvise` failures: `tests/faults/arena_zeroing.rs`.)

mod common;

use allocator_api2::alloc::{Allocator, Layout};
use ckalloc::*;
use common::{fill_runtime, nonzero_from};
use std::io::Write;
use std::process::Command;

const MIB: usize = 1 << 20;
const TOTAL: usize = 32 * MIB;
/// Not page aligned: the runtime region starts 100 bytes into a page.
const AB: usize = 16 * MIB + 100;

/// Build, write the weights (anon mode), fill the runtime region with 0xAB,
/// reset, and check that the runtime region reads zero and the weights
/// kept their bytes. Returns the backing the arena got.
fn reset_reads_zero(b: ArenaBuilder) -> Result<Backing, ArenaError> {
    let mut arena = b.release_on_reset(true).build()?;
    if let Some(w) = arena.weights_mut() {
        w.fill(0x5A);
    }
    let weights_before = arena.weights().to_vec();
    fill_runtime(&arena, 0xAB);
    assert!(nonzero_from(&arena, AB) > 0);
    arena.reset();
    assert_eq!(
        nonzero_from(&arena, AB),
        0,
        "runtime region after reset ({})",
        arena.backing()
    );
    assert_eq!(arena.weights(), &weights_before[..], "weights untouched");
    // A second round: the high-water mark stays, the result too.
    fill_runtime(&arena, 0xCD);
    arena.reset();
    assert_eq!(nonzero_from(&arena, AB), 0, "second reset");
    Ok(arena.backing())
}

fn anon() -> ArenaBuilder {
    BumpArena::builder(TOTAL)
        .activations_base(AB)
        .policy(ModePolicy::AnonOnly)
}

#[test]
fn reset_clears_the_partial_page_shared_with_the_weights() {
    // 32 MiB, runtime region from 16 MiB + 100: the first 3,996 runtime
    // bytes share a page with the weights, which no purge may drop.
    let mut arena = anon().release_on_reset(true).build().unwrap();
    arena.weights_mut().unwrap().fill(0x5A);
    fill_runtime(&arena, 0xAB);
    arena.reset();
    assert_eq!(nonzero_from(&arena, AB), 0);
    assert!(arena.weights().iter().all(|&b| b == 0x5A));
}

#[test]
fn rewind_clears_above_an_unaligned_checkpoint() {
    let mut arena = anon().release_on_reset(true).build().unwrap();
    let keep = 1000;
    let first = Allocator::allocate(&&arena, Layout::from_size_align(keep, 1).unwrap()).unwrap();
    // SAFETY: a fresh block of `keep` bytes.
    unsafe { first.cast::<u8>().as_ptr().write_bytes(0x11, keep) };
    let cp = arena.checkpoint();
    fill_runtime(&arena, 0xAB);
    arena.rewind_to(cp).unwrap();
    let at = AB + cp.used();
    assert_eq!(nonzero_from(&arena, at), 0, "above the checkpoint");
    // SAFETY: the kept block is still allocated and mapped.
    let kept = unsafe { std::slice::from_raw_parts(arena.ptr_at(AB).unwrap().as_ptr(), keep) };
    assert!(kept.iter().all(|&b| b == 0x11), "below the checkpoint");
}

#[test]
fn rewind_inside_a_local_arena_block_run_reads_zero() {
    let mut arena = anon().release_on_reset(true).build().unwrap();
    let cp = arena.checkpoint();
    {
        let local = arena.local();
        for i in 0..200u32 {
            let n = 4096 + i as usize * 37;
            let b = Allocator::allocate(&&local, Layout::from_size_align(n, 8).unwrap()).unwrap();
            // SAFETY: a fresh block of `n` bytes.
            unsafe { b.cast::<u8>().as_ptr().write_bytes(0xEE, n) };
        }
    }
    arena.rewind_to(cp).unwrap();
    assert_eq!(nonzero_from(&arena, AB), 0);
}

#[test]
fn reset_after_several_threads_allocated_reads_zero() {
    let mut arena = anon().release_on_reset(true).build().unwrap();
    std::thread::scope(|s| {
        for t in 0..3u8 {
            let a = &arena;
            s.spawn(move || {
                for _ in 0..64 {
                    let n = 40_000;
                    let b =
                        Allocator::allocate(&a, Layout::from_size_align(n, 1).unwrap()).unwrap();
                    // SAFETY: a fresh block of `n` bytes.
                    unsafe { b.cast::<u8>().as_ptr().write_bytes(0xA0 + t, n) };
                }
            });
        }
    });
    arena.reset();
    assert_eq!(nonzero_from(&arena, AB), 0);
}

#[test]
fn reset_reads_zero_in_mixed_mode_and_keeps_the_boundary_page_weights() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let weights: Vec<u8> = (0..AB).map(|i| (i % 251) as u8 | 1).collect();
    f.write_all(&weights).unwrap();
    f.flush().unwrap();
    let b = BumpArena::builder(TOTAL)
        .weights_file(f.path())
        .activations_base(AB)
        .policy(ModePolicy::MixedOnly);
    let mut arena = b.release_on_reset(true).build().unwrap();
    assert_eq!(arena.mode(), ArenaMode::MixedFileBacked);
    fill_runtime(&arena, 0xAB);
    arena.reset();
    assert_eq!(nonzero_from(&arena, AB), 0);
    assert_eq!(arena.weights(), &weights[..]);
}

/// Base pages: THP switched off for a child process running this test.
#[test]
fn reset_reads_zero_on_base_pages() {
    if std::env::var("CKALLOC_THP").as_deref() == Ok("off") {
        let got = reset_reads_zero(anon().huge(HugeOptions::new().hugetlb(false))).unwrap();
        assert_eq!(got, Backing::Normal);
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "reset_reads_zero_on_base_pages",
            "--exact",
            "--test-threads=1",
        ])
        .env("CKALLOC_THP", "off")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
}

#[test]
fn reset_reads_zero_on_thp() {
    let opts = HugeOptions::new()
        .hugetlb(false)
        .require(Backing::TransparentHuge);
    match reset_reads_zero(anon().huge(opts)) {
        Ok(got) => assert_eq!(got, Backing::TransparentHuge),
        Err(e) => println!("skipped: THP not available ({e})"),
    }
}

#[test]
fn reset_reads_zero_on_2mib_hugetlb() {
    let opts = HugeOptions::new().require(Backing::Hugetlb);
    match reset_reads_zero(anon().huge(opts)) {
        Ok(got) => assert_eq!(got, Backing::Hugetlb),
        Err(e) => println!("skipped: no free 2 MiB hugetlb pages ({e})"),
    }
}

#[test]
fn reset_reads_zero_on_2mib_hugetlb_in_mixed_mode() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&vec![7u8; AB]).unwrap();
    f.flush().unwrap();
    let b = BumpArena::builder(TOTAL)
        .weights_file(f.path())
        .activations_base(AB)
        .policy(ModePolicy::MixedOnly)
        .huge(HugeOptions::new().require(Backing::Hugetlb));
    match reset_reads_zero(b) {
        Ok(got) => assert_eq!(got, Backing::Hugetlb),
        Err(e) => println!("skipped: no free 2 MiB hugetlb pages ({e})"),
    }
}

#[test]
fn reset_reads_zero_on_1gib_hugetlb() {
    let opts = HugeOptions::new()
        .require(Backing::Hugetlb)
        .allow_1gib(true);
    // Probe first: a 1 GiB mapping shows in the mapping's length.
    let probe = anon().huge(opts).build();
    match probe {
        Ok(a) if a.mapping().1.is_multiple_of(1 << 30) => {
            drop(a);
            // With 1 GiB pages the partial page at the runtime start is
            // everything up to the high-water mark: all of it is memset.
            assert_eq!(
                reset_reads_zero(anon().huge(opts)).unwrap(),
                Backing::Hugetlb
            );
        }
        Ok(_) => println!("skipped: no free 1 GiB hugetlb pages (got 2 MiB pages)"),
        Err(e) => println!("skipped: no free 1 GiB hugetlb pages ({e})"),
    }
}

#[test]
fn later_resets_clear_what_was_written_since_and_the_peak_stays() {
    let mut arena = anon().release_on_reset(true).build().unwrap();
    fill_runtime(&arena, 0xAB);
    let peak = arena.high_water_mark();
    arena.reset();
    // A smaller second use: a kept block, a checkpoint, more above it.
    let kept = Allocator::allocate(&&arena, Layout::from_size_align(5000, 1).unwrap()).unwrap();
    // SAFETY: a fresh block of 5000 bytes.
    unsafe { kept.cast::<u8>().as_ptr().write_bytes(0x22, 5000) };
    let cp = arena.checkpoint();
    let more = Allocator::allocate(&&arena, Layout::from_size_align(3 * MIB, 1).unwrap()).unwrap();
    // SAFETY: a fresh block of 3 MiB.
    unsafe { more.cast::<u8>().as_ptr().write_bytes(0x33, 3 * MIB) };
    arena.rewind_to(cp).unwrap();
    assert_eq!(nonzero_from(&arena, AB + cp.used()), 0, "after the rewind");
    assert_eq!(nonzero_from(&arena, AB), 5000, "the kept block stays");
    arena.reset();
    assert_eq!(nonzero_from(&arena, AB), 0, "after the reset");
    assert_eq!(arena.high_water_mark(), peak, "the peak never falls");
}
