//! The background thread: the engine's work off the request path (decay
//! by the clock, promotion to huge pages), as jemalloc's
//! `background_thread`. This module knows nothing of that work: the engine
//! hands [`maybe_start`] a function, which the thread calls in a loop and
//! which says how long the thread sleeps after it (a tick, [`TICK_NS`],
//! when it has nothing left to do now).
//!
//! The rules (docs/engine.md, "The background thread", states them for
//! users):
//!
//! - It runs when a front asks for it ([`want`]: the preload library's
//!   constructor; [`enable_background_thread`](super::enable_background_thread)
//!   for [`CkHuge`](super::CkHuge)) or `CKALLOC_BACKGROUND_THREAD` is set
//!   to an on value, and never when that variable is set to an off value.
//! - It starts at the first huge-path call after that, once the C library
//!   has set up the environment, never inside another start: the state
//!   word below is the guard, so a `malloc` that `pthread_create` makes
//!   finds it starting and goes on without it.
//! - As it starts it runs the engine's start function (which opens the
//!   files its work reads and keeps them: it opens none later), while the
//!   call that started it waits; a thread that does not run within 10 ms
//!   skips it (its work then reads no file).
//! - A `pthread_create` that fails (a thread or process limit, a seccomp
//!   filter) is silent: the state says so ([`BackgroundThread::Failed`]) and the
//!   engine works as without the thread.
//! - In the child of `fork()` no thread runs: the state goes back to
//!   wanted and the child's first huge-path call starts one.
//! - It runs at the priority of the thread whose call starts it, as a
//!   thread inherits it; a real-time policy (`SCHED_FIFO`, `SCHED_RR`) it
//!   leaves for `SCHED_OTHER`, before its work.
//!
//! Atomics only; the thread's own calls allocate nothing.

use crate::env;
use crate::sys;
use std::sync::atomic::{
    AtomicBool, AtomicU8, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst},
};

/// How often the thread runs its work when it has some (100 ms).
pub const TICK_NS: u64 = 100_000_000;

/// The background thread's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackgroundThread {
    /// No front asked for it (a program using only
    /// [`CkHuge`](super::CkHuge), which starts no thread on its own).
    #[default]
    Off,
    /// Asked for, not started yet: the next huge-path call starts it.
    Wanted,
    /// `pthread_create` is running.
    Starting,
    /// Running.
    Running,
    /// `pthread_create` failed: no thread, for the life of the process.
    Failed,
    /// `CKALLOC_BACKGROUND_THREAD` is set to an off value.
    Disabled,
}

impl BackgroundThread {
    fn code(self) -> u8 {
        self as u8
    }

    fn from_code(c: u8) -> BackgroundThread {
        match c {
            1 => BackgroundThread::Wanted,
            2 => BackgroundThread::Starting,
            3 => BackgroundThread::Running,
            4 => BackgroundThread::Failed,
            5 => BackgroundThread::Disabled,
            _ => BackgroundThread::Off,
        }
    }

    /// Its name, as `huge_stats` and the preload summary print it.
    pub fn name(self) -> &'static str {
        match self {
            BackgroundThread::Off => "off",
            BackgroundThread::Wanted => "wanted",
            BackgroundThread::Starting => "starting",
            BackgroundThread::Running => "running",
            BackgroundThread::Failed => "failed to start",
            BackgroundThread::Disabled => "disabled",
        }
    }

    /// Whether the thread runs or is being started: the engine then
    /// leaves promotion to it. (Wanted is not enough: a thread that cannot
    /// start yet, before the C library has set up `environ` or after
    /// `clearenv`, promotes nothing.)
    pub(crate) fn promotes(self) -> bool {
        matches!(self, BackgroundThread::Starting | BackgroundThread::Running)
    }
}

static STATE: AtomicU8 = AtomicU8::new(0);
/// Set by a `fork()` in progress ([`pause_for_fork`]): the thread starts no
/// work until it is cleared.
static PAUSED: AtomicBool = AtomicBool::new(false);
/// Set by the thread while it does its work (claims units it must give
/// back before a `fork()` copies the process).
static BUSY: AtomicBool = AtomicBool::new(false);
/// The work function (`fn() -> u64`, the nanoseconds to sleep), as an
/// address; 0 until the first start.
static WORK: AtomicUsize = AtomicUsize::new(0);
/// The function the thread runs once as it starts (`fn()`), as an address.
static INIT: AtomicUsize = AtomicUsize::new(0);
/// The start function's state ([`START_WAITING`] and after): the thread
/// runs it only if the starting call still waits, so it never runs at a
/// moment of the thread's choosing.
static INIT_STATE: AtomicU8 = AtomicU8::new(START_WAITING);
/// The starting call waits for the start function.
const START_WAITING: u8 = 0;
/// The thread runs the start function; the starting call waits for it.
const START_RUNNING: u8 = 1;
/// The start function returned.
const START_DONE: u8 = 2;
/// The starting call stopped waiting first: the start function never runs.
const START_ABANDONED: u8 = 3;
/// How long a start waits for the thread's start function (10 ms).
const READY_WAIT_NS: u64 = 10_000_000;

/// The state now, `CKALLOC_BACKGROUND_THREAD` applied: set to an off value
/// it is [`BackgroundThread::Disabled`]; set to an on value, [`BackgroundThread::Off`] reads as
/// wanted.
pub(crate) fn state() -> BackgroundThread {
    let s = BackgroundThread::from_code(STATE.load(Relaxed));
    match (s, env::background_thread()) {
        (BackgroundThread::Off, Some(true)) => BackgroundThread::Wanted,
        (_, Some(false)) => BackgroundThread::Disabled,
        (s, _) => s,
    }
}

/// A front asks for the thread (it starts at the next huge-path call);
/// returns the state after.
pub(crate) fn want() -> BackgroundThread {
    let _ = STATE.compare_exchange(
        BackgroundThread::Off.code(),
        BackgroundThread::Wanted.code(),
        AcqRel,
        Relaxed,
    );
    state()
}

/// Start the thread if it is wanted and not running: it runs `init` once,
/// while this call waits (never after: a thread not running within 10 ms
/// skips it), then `work` in a loop. One load
/// when it runs. Returns `true` when the thread failed to start just now
/// (the caller undoes what it did for the thread).
#[inline]
pub(crate) fn maybe_start(init: fn(), work: fn() -> u64) -> bool {
    if state() != BackgroundThread::Wanted {
        return false;
    }
    start(init, work)
}

#[cold]
fn start(init: fn(), work: fn() -> u64) -> bool {
    if !sys::environment_ready() {
        return false;
    }
    let from = STATE.load(Acquire);
    if from == BackgroundThread::Starting.code()
        || from == BackgroundThread::Running.code()
        || STATE
            .compare_exchange(from, BackgroundThread::Starting.code(), AcqRel, Relaxed)
            .is_err()
    {
        return false;
    }
    WORK.store(work as usize, Release);
    INIT.store(init as usize, Release);
    INIT_STATE.store(START_WAITING, SeqCst);
    match sys::spawn_detached(run) {
        Ok(()) => {
            STATE.store(BackgroundThread::Running.code(), Release);
            // The thread's start function opens files: done while the
            // program's thread waits in this call, as a library call that
            // opens a file would, or never (a thread not running within
            // the wait gives it up).
            let until = sys::monotonic_ns().saturating_add(READY_WAIT_NS);
            loop {
                let s = INIT_STATE.load(SeqCst);
                let late = s == START_WAITING
                    && sys::monotonic_ns() >= until
                    && INIT_STATE
                        .compare_exchange(START_WAITING, START_ABANDONED, SeqCst, SeqCst)
                        .is_ok();
                if s == START_DONE || late {
                    break;
                }
                sys::sleep_ns(20_000);
            }
            false
        }
        Err(_) => {
            STATE.store(BackgroundThread::Failed.code(), Release);
            true
        }
    }
}

/// The thread: the work, then a sleep, for the life of the process. The
/// work runs inside `BUSY`, and never while a `fork()` is in progress.
extern "C" fn run(_: *mut libc::c_void) -> *mut libc::c_void {
    let init = INIT.load(Acquire);
    let waited = INIT_STATE
        .compare_exchange(START_WAITING, START_RUNNING, SeqCst, SeqCst)
        .is_ok();
    if waited && init != 0 {
        // SAFETY: `INIT` holds only addresses of `fn()` stored by `start`,
        // valid for the life of the process.
        let init: fn() = unsafe { std::mem::transmute::<usize, fn()>(init) };
        init();
    }
    if waited {
        INIT_STATE.store(START_DONE, SeqCst);
    }
    // A real-time policy inherited from the starter is left, and then the
    // thread takes its name: whoever finds it by name finds it at the
    // policy it works at.
    sys::leave_real_time();
    sys::name_this_thread(c"ckalloc-bg");
    loop {
        let w = WORK.load(Acquire);
        BUSY.store(true, SeqCst);
        let sleep = if w == 0 || PAUSED.load(SeqCst) {
            TICK_NS
        } else {
            // SAFETY: `WORK` holds only addresses of `fn() -> u64` stored
            // by `start`, valid for the life of the process.
            let work: fn() -> u64 = unsafe { std::mem::transmute::<usize, fn() -> u64>(w) };
            work()
        };
        BUSY.store(false, SeqCst);
        sys::sleep_ns(sleep);
    }
}

/// Whether a `fork()` waits for the thread: its work stops at the next
/// unit it would take.
pub(crate) fn pausing() -> bool {
    PAUSED.load(Relaxed)
}

/// Sleep `ns` inside the work, at a point where the thread holds no
/// claimed unit: a `fork()` does not wait for the sleep. Returns `false`
/// when a `fork()` is in progress after it: the work stops there.
pub(crate) fn pause_point(ns: u64) -> bool {
    BUSY.store(false, SeqCst);
    sys::sleep_ns(ns);
    BUSY.store(true, SeqCst);
    // Paired with `pause_for_fork` (both `SeqCst`): either it sees `BUSY`
    // set and waits, or this load sees `PAUSED`.
    !PAUSED.load(SeqCst)
}

/// `pthread_atfork` prepare: keep the thread from starting work and wait
/// until it is done with what it has claimed, so the child's copy holds no
/// unit claimed by a thread it does not have. The thread takes no lock;
/// its work stops at the next unit (a decay step at its next run) and
/// sleeps outside `BUSY` ([`pause_point`]), so the wait is one system call
/// or a few. `BUSY` is read whatever the state: a thread whose starter has
/// not yet marked it running may be working already (and no thread never
/// sets it).
pub(crate) fn pause_for_fork() {
    PAUSED.store(true, SeqCst);
    while BUSY.load(SeqCst) {
        sys::sleep_ns(50_000);
    }
}

/// `pthread_atfork` parent: the thread goes on.
pub(crate) fn resume_after_fork() {
    PAUSED.store(false, SeqCst);
}

/// In the child of `fork()`: no thread runs there; the next huge-path call
/// starts one.
pub(crate) fn after_fork_in_child() {
    PAUSED.store(false, Relaxed);
    BUSY.store(false, Relaxed);
    let s = STATE.load(Relaxed);
    if s == BackgroundThread::Running.code() || s == BackgroundThread::Starting.code() {
        STATE.store(BackgroundThread::Wanted.code(), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_keep_their_codes() {
        for s in [
            BackgroundThread::Off,
            BackgroundThread::Wanted,
            BackgroundThread::Starting,
            BackgroundThread::Running,
            BackgroundThread::Failed,
            BackgroundThread::Disabled,
        ] {
            assert_eq!(BackgroundThread::from_code(s.code()), s);
        }
        assert!(BackgroundThread::Starting.promotes() && BackgroundThread::Running.promotes());
        assert!(!BackgroundThread::Wanted.promotes());
        assert!(!BackgroundThread::Failed.promotes() && !BackgroundThread::Off.promotes());
    }

    #[test]
    fn a_pacing_sleep_is_outside_the_fork_wait_and_stops_at_a_fork() {
        // This test binary starts no background thread: `BUSY` is the
        // test's, and is false again at the end.
        assert!(pause_point(0), "no fork in progress");
        PAUSED.store(true, SeqCst);
        assert!(!pause_point(0), "a fork is waiting");
        PAUSED.store(false, SeqCst);
        BUSY.store(false, SeqCst);
    }
}
