//! [`ManifestBinding`]: what ties a manifest to the file it describes.

use std::fmt;

/// What ties a manifest to the `weights.bump` it describes (see
/// [`WeightsFile`](super::WeightsFile)'s "What verified means").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ManifestBinding {
    /// The v5 metadata's `manifest_hash` equals the SHA-256 of the JSON
    /// sidecar in canonical form: the JSON is the one written with the file,
    /// and so is a `.map` beside it (the two agree on every field).
    ManifestHash,
    /// The v5 metadata records a `manifest_hash`, but the manifest was not
    /// read from the JSON sidecar (only `weights_manifest.map` exists, or the
    /// entries were built in memory): nothing compared them.
    HashUnchecked,
    /// The file records no manifest hash: nothing ties the manifest to it.
    Unbound {
        /// Why: a `BUMPWGT3`/`BUMPWGT4` file, or v5 metadata without one.
        why: &'static str,
    },
}

impl fmt::Display for ManifestBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ManifestBinding::ManifestHash => {
                f.write_str("bound by the BUMPWGT5 manifest_hash (weights_manifest.json verified)")
            }
            ManifestBinding::HashUnchecked => f.write_str(
                "NOT checked: the BUMPWGT5 metadata records a manifest_hash, but there is no \
                 weights_manifest.json to compare it with",
            ),
            ManifestBinding::Unbound { why } => write!(f, "not bound: {why}"),
        }
    }
}
