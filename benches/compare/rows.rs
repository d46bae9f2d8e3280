//! The table of rows; each returns one or more results.

use crate::Row;

pub type RowFn = fn(bool) -> Vec<Row>;

pub fn all() -> Vec<(&'static str, RowFn)> {
    vec![
        ("first_touch", crate::pages::first_touch as RowFn),
        ("random_reads", crate::pages::random_reads as RowFn),
    ]
}
