//! [`Manifest`]: the tensors of a `weights.bump`, in the order a sidecar
//! lists them, with an index by name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::entry::ManifestEntry;
use super::error::WeightsError;

/// A parsed manifest: entries in the order the sidecar lists them (ckalloc's
/// writer lists them in file-offset order) and an index by name.
///
/// Parsing checks the syntax, the name rule ([`check_name`](super::check_name)) and unique
/// names; nothing more. [`WeightsFile::check_manifest`](super::WeightsFile::check_manifest)
/// checks a manifest against its file.
///
/// Immutable after construction; `Send + Sync`. Two manifests are equal when
/// their entries are (the JSON `format`, `generator` and `alignment` and the
/// sidecar digest are not compared).
#[derive(Clone, Debug, Default)]
pub struct Manifest {
    pub(super) entries: Vec<ManifestEntry>,
    pub(super) index: HashMap<String, usize>,
    pub(super) format: Option<String>,
    pub(super) generator: Option<String>,
    pub(super) alignment: Option<u64>,
    pub(super) json_sha256: Option<[u8; 32]>,
    pub(super) json_path: Option<PathBuf>,
}

impl PartialEq for Manifest {
    fn eq(&self, other: &Manifest) -> bool {
        self.entries == other.entries
    }
}

impl Eq for Manifest {}

impl Manifest {
    /// Build from entries (kept in the given order).
    ///
    /// # Errors
    /// [`WeightsError::InvalidTensorName`] for a name that breaks
    /// [`check_name`](super::check_name), [`WeightsError::ManifestSyntax`] for a dtype a `.map`
    /// line cannot hold, [`WeightsError::DuplicateTensor`] if two entries
    /// share a name.
    pub fn from_entries(entries: Vec<ManifestEntry>) -> Result<Manifest, WeightsError> {
        let mut index = HashMap::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            e.check()?;
            if index.insert(e.name.clone(), i).is_some() {
                return Err(WeightsError::DuplicateTensor {
                    name: e.name.clone(),
                });
            }
        }
        Ok(Manifest {
            entries,
            index,
            ..Manifest::default()
        })
    }

    /// The JSON manifest's `format` string (`ck-bumpwgt5-manifest-v1`...), if any.
    pub fn format(&self) -> Option<&str> {
        self.format.as_deref()
    }

    /// The JSON manifest's `generator` string (`ckalloc 0.1.0`...), if any.
    pub fn generator(&self) -> Option<&str> {
        self.generator.as_deref()
    }

    /// The JSON manifest's `alignment` (bytes; ckalloc's writer records it), if any.
    pub fn alignment(&self) -> Option<u64> {
        self.alignment
    }

    /// SHA-256 of the JSON sidecar in canonical form, when the manifest was
    /// read from one ([`from_json`](Self::from_json), or
    /// [`load_sidecars`](Self::load_sidecars) with the JSON present).
    pub fn json_sha256(&self) -> Option<&[u8; 32]> {
        self.json_sha256.as_ref()
    }

    /// The JSON sidecar's path, when [`load_sidecars`](Self::load_sidecars) read one.
    pub fn json_path(&self) -> Option<&Path> {
        self.json_path.as_deref()
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&ManifestEntry> {
        self.index.get(name).map(|&i| &self.entries[i])
    }

    /// Entries in manifest order.
    pub fn iter(&self) -> std::slice::Iter<'_, ManifestEntry> {
        self.entries.iter()
    }

    /// Entries as a slice, in manifest order.
    pub fn entries(&self) -> &[ManifestEntry] {
        &self.entries
    }

    /// Entries sorted by `(file_offset, size)`.
    pub fn sorted_by_offset(&self) -> Vec<&ManifestEntry> {
        let mut v: Vec<&ManifestEntry> = self.entries.iter().collect();
        v.sort_by_key(|e| (e.file_offset, e.size));
        v
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Sum of entry sizes (bytes), saturating.
    pub fn total_bytes(&self) -> u64 {
        self.entries
            .iter()
            .fold(0u64, |a, e| a.saturating_add(e.size))
    }
}

impl<'a> IntoIterator for &'a Manifest {
    type Item = &'a ManifestEntry;
    type IntoIter = std::slice::Iter<'a, ManifestEntry>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter()
    }
}
