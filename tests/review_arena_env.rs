//! Review finding 4: with
//! `CK_BUMP_FORCE_MIXED` set and no weights file, `build()` (and the C ABI's
//! `ck_bump_alloc_init(a, NULL, ...)`) fails with `NoWeightsFile` — "no weights
//! file: mixed mode and materialization need one (builder .weights_file(path))" —
//! which did not say that the environment variable is why anonymous mode
//! was skipped. Now `ForcedMixedWithoutFile` names it. Own test binary: it sets the environment.

#[test]
#[cfg_attr(miri, ignore)]
fn review_force_mixed_without_file_names_the_variable() {
    std::env::set_var("CK_BUMP_FORCE_MIXED", "1");
    let err = ckalloc::BumpArena::builder(1 << 20)
        .build()
        .expect_err("mixed mode needs a file");
    let msg = err.to_string();
    assert!(
        msg.contains("CK_BUMP_FORCE_MIXED"),
        "the error must name the variable that skipped anonymous mode: {msg}"
    );
}
