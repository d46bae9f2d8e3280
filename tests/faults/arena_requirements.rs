//! A required hugetlb tier whose `mmap` the kernel refuses (injected here,
//! so the case holds on machines with free hugetlb pages too): each mode
//! fails with `HugeError::TierUnavailable`, never a lower tier.
//! (The requirements without injected faults: `tests/arena_requirements.rs`.)

use crate::serial;
use ckalloc::fault::{self, Op};
use ckalloc::*;
use std::io::Write;

const MIB: usize = 1 << 20;
const AB: usize = 8192 + 50;

fn tier_unavailable(e: &HugeError) -> bool {
    matches!(
        e,
        HugeError::TierUnavailable {
            required: Backing::Hugetlb,
            ..
        }
    )
}

#[test]
fn refused_hugetlb_mmap_fails_each_mode_with_tier_unavailable() {
    let _g = serial();
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&[0x42; AB]).unwrap();
    f.flush().unwrap();
    let build = |policy| {
        BumpArena::builder(8 * MIB)
            .weights_file(f.path())
            .activations_base(AB)
            .policy(policy)
            .huge(HugeOptions::new().require(Backing::Hugetlb))
            .build()
    };

    // Anon mode: the first mmap is the hugetlb one.
    fault::fail_nth(Op::Mmap, 1, libc::ENOMEM);
    let e = build(ModePolicy::AnonOnly).unwrap_err();
    fault::reset();
    assert!(
        matches!(&e, ArenaError::Anon { source, .. } if tier_unavailable(source)),
        "{e:?}"
    );

    // Mixed mode: the weights pages' trial mapping, the reservation, the
    // weights pages, then the runtime region's hugetlb pages.
    fault::fail_nth(Op::Mmap, 4, libc::ENOMEM);
    let e = build(ModePolicy::MixedOnly).unwrap_err();
    fault::reset();
    assert!(
        matches!(&e, ArenaError::MixedOptions { source } if tier_unavailable(source)),
        "{e:?}"
    );
}
