//! ckalloc: huge-page memory, a weights + activations bump arena, and a
//! caching allocator for model-serving programs.
//!
//! (Crate documentation is written in full once the pieces land.)

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod sys;

pub mod caching;
#[cfg(feature = "weights")]
pub mod weights;
