//! `fork()` while another thread is inside the allocator: the child can call
//! into the allocator (docs/reliability.md, "Fork safety").
//!
//! Each lock test holds one of the crate's locks on another thread while the
//! main thread forks; the child calls into the allocator under `alarm(5)`
//! and exits with `_exit(0)`, and the parent asserts a clean exit. Without
//! fork handlers the child inherits the held lock and hangs until the alarm
//! kills it. The storm test forks repeatedly while four threads allocate.
#![cfg(target_os = "linux")]

use std::alloc::Layout;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use allocator_api2::alloc::{Allocator, Global};
use ckalloc::caching::CachingAllocator;

/// How long a holder keeps its lock after telling the main thread to fork.
const HOLD: Duration = Duration::from_millis(300);

/// Forks; the child runs `body` under `alarm(5)` and exits 0 if it returned
/// true, 1 otherwise (a signal if it hung). Returns the child's wait status.
fn fork_child(body: impl FnOnce() -> bool) -> libc::c_int {
    // SAFETY: the child runs `body` (allocator calls) and `_exit`s; it never
    // returns into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: alarm and _exit have no preconditions.
        unsafe { libc::alarm(5) };
        let ok = catch_unwind(AssertUnwindSafe(body)).unwrap_or(false);
        // SAFETY: as above.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    loop {
        // SAFETY: `pid` is our child; `status` is writable.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return status;
        }
        let err = std::io::Error::last_os_error();
        assert_eq!(err.raw_os_error(), Some(libc::EINTR), "waitpid: {err}");
    }
}

fn assert_clean_exit(status: libc::c_int, what: &str) {
    if libc::WIFSIGNALED(status) {
        panic!(
            "{what}: the child was killed by signal {} (SIGALRM = {}: it hung)",
            libc::WTERMSIG(status),
            libc::SIGALRM
        );
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{what}: the child failed (wait status {status:#x})"
    );
}

/// Runs `hold` on another thread (it takes a lock, signals, keeps the lock
/// for [`HOLD`], releases it), forks once it signalled, and asserts that the
/// child running `child` exits cleanly.
fn fork_while_held(
    what: &str,
    hold: impl FnOnce(mpsc::Sender<()>) + Send + 'static,
    child: impl FnOnce() -> bool,
) {
    let (tx, rx) = mpsc::channel();
    let holder = thread::spawn(move || hold(tx));
    rx.recv().expect("the holder took its lock");
    let status = fork_child(child);
    holder.join().expect("holder thread");
    assert_clean_exit(status, what);
}

/// Keeps `held` (a lock guard) for [`HOLD`] after signalling `tx`.
fn keep<H>(held: H, tx: mpsc::Sender<()>) {
    tx.send(()).expect("main thread waits");
    thread::sleep(HOLD);
    drop(held);
}

#[cfg(feature = "capi")]
mod c_abi {
    use super::*;
    use ckalloc::capi::{
        ck_bump_alloc_free, ck_bump_alloc_init, ck_huge_alloc, ck_huge_free, CkBumpAlloc,
    };
    use ckalloc::fork_hooks;

    const MIB: usize = 1 << 20;

    /// ck_huge_alloc(4 MiB), a write to each end, ck_huge_free.
    pub fn huge_round_trip() -> bool {
        let p = ck_huge_alloc(4 * MIB).cast::<u8>();
        if p.is_null() {
            return false;
        }
        // SAFETY: a live 4 MiB block.
        unsafe {
            p.write(1);
            p.add(4 * MIB - 1).write(2);
            ck_huge_free(p.cast(), 4 * MIB);
        }
        true
    }

    /// ck_bump_alloc_init of an 8 MiB anonymous arena, then ck_bump_alloc_free.
    pub fn bump_round_trip() -> bool {
        let mut a = std::mem::MaybeUninit::<CkBumpAlloc>::uninit();
        // SAFETY: `a` is writable; NULL path = anonymous arena.
        let rc = unsafe { ck_bump_alloc_init(a.as_mut_ptr(), std::ptr::null(), 8 * MIB, 0, 0) };
        if rc != 0 {
            return false;
        }
        // SAFETY: initialized by the successful call.
        unsafe { ck_bump_alloc_free(a.as_mut_ptr()) };
        true
    }

    #[test]
    fn child_allocates_huge_blocks_while_a_parent_thread_allocates_and_frees_them() {
        let stop = Arc::new(AtomicBool::new(false));
        let churn = {
            let stop = Arc::clone(&stop);
            thread::spawn(move || {
                let mut rounds = 0u64;
                while !stop.load(Ordering::Relaxed) || rounds == 0 {
                    assert!(huge_round_trip(), "parent round trip");
                    rounds += 1;
                }
                rounds
            })
        };
        let mut statuses = Vec::new();
        for _ in 0..20 {
            statuses.push(fork_child(|| (0..3).all(|_| huge_round_trip())));
        }
        stop.store(true, Ordering::Relaxed);
        assert!(churn.join().expect("churn thread") > 0);
        for status in statuses {
            assert_clean_exit(status, "ck_huge_alloc in the child");
        }
    }

    #[test]
    fn child_creates_arenas_while_the_parent_held_the_arena_registry() {
        fork_while_held(
            "arena registry",
            |tx| keep(fork_hooks::hold_c_arena_registry(), tx),
            bump_round_trip,
        );
    }
}

/// A shared cache with one block of `cached` bytes on its free list.
fn shared_cache(cached: Layout) -> Arc<CachingAllocator<Global>> {
    let cache = Arc::new(CachingAllocator::unbounded(Global));
    let p = cache.allocate(cached).expect("allocate");
    // SAFETY: allocated above with `cached`.
    unsafe { cache.deallocate(p.cast(), cached) };
    cache
}

/// A hit of `cached`, a miss of a size never used before, both released;
/// then a whole new allocator (which enters the instance registry).
fn cache_round_trip(cache: &CachingAllocator<Global>, cached: Layout) -> bool {
    let fresh = Layout::from_size_align(3 * 4096 + 64, 64).expect("layout");
    let (Ok(a), Ok(b)) = (cache.allocate(cached), cache.allocate(fresh)) else {
        return false;
    };
    // SAFETY: both blocks are live, with these layouts.
    unsafe {
        a.cast::<u8>().as_ptr().write(1);
        b.cast::<u8>().as_ptr().write(2);
        cache.deallocate(a.cast(), cached);
        cache.deallocate(b.cast(), fresh);
    }
    let other = CachingAllocator::unbounded(Global);
    let Ok(c) = other.allocate(cached) else {
        return false;
    };
    // SAFETY: live block with this layout.
    unsafe { other.deallocate(c.cast(), cached) };
    true
}

const CACHED: Layout = match Layout::from_size_align(64 * 1024, 4096) {
    Ok(l) => l,
    Err(_) => panic!("layout"),
};

#[test]
fn child_uses_a_shared_cache_while_the_parent_held_each_pool_shard() {
    let cache = shared_cache(CACHED);
    for shard in 0..cache.pool_shard_count() {
        let c = Arc::clone(&cache);
        fork_while_held(
            &format!("pool 0 shard {shard}"),
            move |tx| keep(c.hold_pool_shard_lock(0, shard).expect("shard"), tx),
            || cache_round_trip(&cache, CACHED),
        );
    }
}

#[test]
fn child_uses_a_shared_cache_while_the_parent_held_the_block_table() {
    let cache = shared_cache(CACHED);
    let c = Arc::clone(&cache);
    fork_while_held(
        "block table",
        move |tx| keep(c.hold_block_table_locks(), tx),
        || cache_round_trip(&cache, CACHED),
    );
}

#[test]
fn child_creates_caches_while_the_parent_held_the_instance_registry() {
    let cache = shared_cache(CACHED);
    fork_while_held(
        "instance registry",
        |tx| keep(ckalloc::fork_hooks::hold_caching_registry(), tx),
        || cache_round_trip(&cache, CACHED),
    );
}

/// 200 forks or 10 s, whichever comes first, while two threads loop
/// `ck_huge_alloc(4 MiB)` / `ck_huge_free` and two threads allocate and free
/// through one shared cache (also creating and dropping caches of their own);
/// every child calls both and must exit cleanly.
#[test]
fn every_child_of_a_fork_storm_completes() {
    let cache = shared_cache(CACHED);
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    #[cfg(feature = "capi")]
    for _ in 0..2 {
        let stop = Arc::clone(&stop);
        workers.push(thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                assert!(c_abi::huge_round_trip(), "ck_huge_alloc in the parent");
            }
        }));
    }
    for i in 0..2 {
        let stop = Arc::clone(&stop);
        let cache = Arc::clone(&cache);
        workers.push(thread::spawn(move || {
            let sizes = [CACHED.size(), 4096 + 64 * i, 1 << 20];
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let layout = Layout::from_size_align(sizes[n % sizes.len()], 64).expect("layout");
                let p = cache.allocate(layout).expect("allocate in the parent");
                // SAFETY: live block with this layout.
                unsafe { cache.deallocate(p.cast(), layout) };
                if n.is_multiple_of(64) {
                    drop(CachingAllocator::unbounded(Global));
                }
                n += 1;
            }
        }));
    }
    let start = Instant::now();
    let mut forks = 0;
    while forks < 200 && start.elapsed() < Duration::from_secs(10) {
        let status = fork_child(|| {
            #[cfg(feature = "capi")]
            if !c_abi::huge_round_trip() || !c_abi::bump_round_trip() {
                return false;
            }
            cache_round_trip(&cache, CACHED)
        });
        forks += 1;
        if let Err(e) = catch_unwind(|| assert_clean_exit(status, &format!("fork {forks}"))) {
            stop.store(true, Ordering::Relaxed);
            std::panic::resume_unwind(e);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker");
    }
    assert!(forks >= 1);
    eprintln!("{forks} forks, every child completed");
}

/// The crate's `pthread_atfork` handlers are registered when the library is
/// loaded, before any caching allocator, C arena or retained block exists
/// (so never from inside `malloc` or `free`). A fresh process (this test
/// binary run again, for this test alone) checks it before touching
/// anything else of the crate.
#[test]
fn fork_handlers_are_registered_when_the_library_loads() {
    const FRESH: &str = "CKALLOC_TEST_FRESH_PROCESS";
    if std::env::var_os(FRESH).is_some() {
        assert!(ckalloc::fork_hooks::fork_handlers_registered());
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "fork_handlers_are_registered_when_the_library_loads",
            "--test-threads=1",
        ])
        .env(FRESH, "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
}
