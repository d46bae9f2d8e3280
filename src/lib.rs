//! ckalloc: huge-page memory, a weights + activations bump arena, and a
//! caching allocator for model-serving programs.
//!
//! (Crate documentation is written in full once the pieces land.)

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod sys;

mod arena;
pub mod caching;
#[cfg(feature = "capi")]
pub mod capi;
mod huge;
mod probe;
mod stats;
#[cfg(feature = "weights")]
pub mod weights;

pub use arena::{
    ArenaBuilder, ArenaCoverage, ArenaError, ArenaMode, BumpArena, Checkpoint, FallbackReason,
    LocalArena, ModePolicy,
};
pub use huge::{
    huge_alloc, huge_free, reset_hugetlb_backoff, Backing, CkHuge, HugeError, HugeOptions,
    HugeRegion,
};
pub use probe::{huge_page_coverage, probe, HugeCoverage, HugetlbPool, SystemHugePages};
pub use stats::{huge_stats, HugeStats, TierStats};

/// Test-only fault injection into the OS layer (feature `fault-injection`).
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
pub mod fault {
    pub use crate::sys::fault::*;
    pub use crate::sys::Op;
}
