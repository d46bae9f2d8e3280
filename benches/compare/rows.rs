//! The table of rows; each returns one or more results.

use crate::Row;

pub type RowFn = fn(bool) -> Vec<Row>;

pub fn all() -> Vec<(&'static str, RowFn)> {
    vec![
        ("bump", crate::alloc::bump as RowFn),
        ("first_touch", crate::pages::first_touch as RowFn),
        ("random_reads", crate::pages::random_reads as RowFn),
        ("cache_loop", crate::alloc::cache_loop as RowFn),
        ("weights", crate::weights::weights as RowFn),
        ("threads", crate::alloc::threads as RowFn),
        ("pool_lock", crate::alloc::pool_lock as RowFn),
        ("trace", crate::trace::replay_rows as RowFn),
        ("purge", crate::purge::purge as RowFn),
        ("sweep", crate::plot::sweep as RowFn),
    ]
}
