//! [`WeightsFile::check_manifest`]: every rule a manifest keeps against its
//! file, in one place, and what the check found ([`CheckedManifest`]).

use std::fmt;
use std::path::PathBuf;

use super::binding::ManifestBinding;
use super::container::{Container, Version};
use super::dtype::Producer;
use super::entry::{check_shape, ManifestEntry};
use super::error::WeightsError;
use super::file::{FileIdentity, WeightsFile};
use super::manifest::Manifest;
use super::report::{Gap, LayoutReport};
use super::sidecars::MANIFEST_JSON;
use super::writer::MAX_ALIGNMENT;

/// The padding C-Kernel-Engine's converters may leave between tensors
/// (bytes): the gap allowed when a file records no alignment.
const CKE_ALIGNMENT: u64 = 64;

/// What [`WeightsFile::check_manifest`] refuses beyond the rules every file
/// keeps. `CheckOptions::default()` refuses nothing more and reports the
/// rest as [`ManifestWarning`]s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CheckOptions {
    strict: bool,
    require_manifest_hash: bool,
}

impl CheckOptions {
    /// Refuse nothing beyond the rules (the default).
    pub const fn new() -> Self {
        CheckOptions {
            strict: false,
            require_manifest_hash: false,
        }
    }

    /// Refuse every [`ManifestWarning`] with its error: a gap wider than the
    /// file's alignment ([`WeightsError::WideGap`]), a `manifest_hash` that
    /// could not be checked ([`WeightsError::ManifestNotBound`]), a dtype
    /// table that disagrees while nothing protects the producer's name
    /// ([`WeightsError::DtypeTableMismatch`]). Default `false`.
    pub const fn strict(mut self, yes: bool) -> Self {
        self.strict = yes;
        self
    }

    /// Refuse a manifest that a verified `manifest_hash` does not bind to
    /// the file ([`WeightsError::ManifestNotBound`]): every `BUMPWGT3` and
    /// `BUMPWGT4` file, a `BUMPWGT5` file whose metadata records no hash, and
    /// a manifest not read from the JSON sidecar. Default `false`.
    pub const fn require_manifest_hash(mut self, yes: bool) -> Self {
        self.require_manifest_hash = yes;
        self
    }
}

/// How the dtype table was compared with the manifest (rule 9 of
/// [`WeightsFile::check_manifest`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DtypeTableCheck {
    /// The file names ckalloc as its writer, whose table holds one code per
    /// entry in file order: every code equals its entry's dtype code.
    Checked,
    /// Another writer: C-Kernel-Engine's converters fill the table from their
    /// own weight lists, so it is a per-slot hint and the manifest's dtype
    /// names win. `note` says how the two differ (`None`: one code per
    /// entry, each matching).
    Hint {
        /// One line describing the difference.
        note: Option<String>,
    },
}

/// Something [`WeightsFile::check_manifest`] reports but refuses only with
/// [`CheckOptions::strict`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ManifestWarning {
    /// Bytes of the tensor data that no entry covers, more than the
    /// alignment the file records (C-Kernel-Engine's 64 bytes when it records
    /// none): a tensor may be missing from the manifest.
    WideGap {
        /// The uncovered bytes.
        gap: Gap,
        /// The padding allowed (bytes).
        allowed: u64,
    },
    /// The v5 metadata records a `manifest_hash` that could not be checked
    /// ([`ManifestBinding::HashUnchecked`]).
    ManifestHashUnchecked,
    /// The dtype table has one slot per entry but disagrees with the
    /// manifest, and the only word on the file's writer is one nothing
    /// protects (a `BUMPWGT4` manifest's `generator`): the file may be
    /// ckalloc's, whose table must agree, with that field edited.
    UnprotectedDtypeTable {
        /// How the table disagrees.
        reason: String,
    },
    /// The header's model fields disagree with themselves or with the v5
    /// metadata's `config` (rule 10 of [`WeightsFile::check_manifest`]):
    /// the header, which no checksum covers, may have been altered.
    HeaderDims {
        /// Every field that disagrees, with both values.
        reason: String,
    },
}

impl ManifestWarning {
    /// The error [`CheckOptions::strict`] refuses the file with.
    pub fn to_error(&self) -> WeightsError {
        match self {
            ManifestWarning::WideGap { gap, allowed } => WeightsError::WideGap {
                range: (gap.start, gap.end),
                after: gap.after.clone(),
                allowed: *allowed,
            },
            ManifestWarning::ManifestHashUnchecked => WeightsError::ManifestNotBound {
                binding: ManifestBinding::HashUnchecked,
            },
            ManifestWarning::UnprotectedDtypeTable { reason } => WeightsError::DtypeTableMismatch {
                reason: reason.clone(),
            },
            ManifestWarning::HeaderDims { reason } => WeightsError::HeaderDimsMismatch {
                reason: reason.clone(),
            },
        }
    }
}

impl fmt::Display for ManifestWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ManifestWarning::ManifestHashUnchecked => f.write_str(
                "the recorded manifest_hash could not be checked: there is no weights_manifest.json",
            ),
            ManifestWarning::UnprotectedDtypeTable { reason } => write!(
                f,
                "the dtype table disagrees with the manifest ({}), and nothing protects the \
                 manifest's generator field, the only word on who wrote the file",
                crate::Escaped::new(reason)
            ),
            ManifestWarning::WideGap { .. } | ManifestWarning::HeaderDims { .. } => {
                write!(f, "{}", self.to_error())
            }
        }
    }
}

/// What an arena compares with its weights file, whoever checked the
/// manifest (a file on disk or bytes in memory): the length, and the
/// header's checksum at its layout's offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Fingerprint {
    pub(crate) len: u64,
    pub(crate) checksum_offset: u64,
    pub(crate) checksum: [u8; 32],
}

/// A manifest that [`WeightsFile::check_manifest`] accepted for a file, with
/// what the check found: what binds it to the file, how the dtype table
/// compared, and warnings. The only way to give an arena a manifest
/// ([`ArenaBuilder::manifest`](crate::ArenaBuilder::manifest)).
///
/// Immutable; `Send + Sync`.
#[derive(Clone, Debug)]
pub struct CheckedManifest {
    manifest: Manifest,
    container: Container,
    version: Version,
    producer: Producer,
    binding: ManifestBinding,
    dtype_table: DtypeTableCheck,
    warnings: Vec<ManifestWarning>,
    tensor_data: (u64, u64),
    path: Option<PathBuf>,
    identity: Option<FileIdentity>,
    fingerprint: Fingerprint,
}

impl CheckedManifest {
    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The manifest, giving up the check's findings.
    pub fn into_manifest(self) -> Manifest {
        self.manifest
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&ManifestEntry> {
        self.manifest.get(name)
    }

    /// The layout of the file it was checked against.
    pub fn container(&self) -> Container {
        self.container
    }

    /// The container version of the file it was checked against.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Who wrote the file, for reading its dtype-table codes.
    pub fn producer(&self) -> Producer {
        self.producer
    }

    /// What ties the manifest to the file.
    pub fn binding(&self) -> ManifestBinding {
        self.binding
    }

    /// How the dtype table compared with the manifest.
    pub fn dtype_table(&self) -> &DtypeTableCheck {
        &self.dtype_table
    }

    /// What the check reports without refusing (empty under
    /// [`CheckOptions::strict`], which refuses each).
    pub fn warnings(&self) -> &[ManifestWarning] {
        &self.warnings
    }

    /// The file's tensor data, `[tensor_data_start, data_end)` (bytes).
    pub fn tensor_data(&self) -> (u64, u64) {
        self.tensor_data
    }

    /// The weights region an arena needs, `[first tensor's offset,
    /// data_end)` (bytes; empty at `data_end` without tensors): with arena
    /// offset == file offset, `weights_base` and `activations_base`.
    pub fn weights_region(&self) -> (u64, u64) {
        let end = self.tensor_data.1;
        let start = self
            .manifest
            .iter()
            .map(|e| e.file_offset)
            .min()
            .unwrap_or(end);
        (start, end)
    }

    /// Gaps and coverage of the tensor data, for a report.
    pub fn layout(&self) -> LayoutReport {
        self.manifest
            .layout_report(self.tensor_data.0, self.tensor_data.1)
    }

    /// The path of the file it was checked against (`None` for bytes in memory).
    pub fn path(&self) -> Option<&std::path::Path> {
        self.path.as_deref()
    }

    pub(crate) fn identity(&self) -> Option<FileIdentity> {
        self.identity
    }

    pub(crate) fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }
}

/// An alignment a file records, if it is one a writer could use (a power
/// of two up to 1 GiB) and the file keeps it: every entry's offset and the
/// end of the tensor data are multiples of it, as ckalloc's writer places
/// them. A recorded alignment the offsets do not keep widens no gap.
fn kept_alignment(a: Option<u64>, manifest: &Manifest, data_end: u64) -> Option<u64> {
    a.filter(|&a| {
        a.is_power_of_two()
            && a <= MAX_ALIGNMENT
            && data_end.is_multiple_of(a)
            && manifest.iter().all(|e| e.file_offset.is_multiple_of(a))
    })
}

/// Rule 9 for a ckalloc file: one code per entry, in file-offset order,
/// each the code of the entry's dtype.
fn table_matches(table: &[u8], manifest: &Manifest) -> Result<(), WeightsError> {
    if table.len() != manifest.len() {
        return Err(WeightsError::DtypeTableMismatch {
            reason: format!(
                "table has {} entries, manifest {}",
                table.len(),
                manifest.len()
            ),
        });
    }
    for (i, (e, &code)) in manifest
        .sorted_by_offset()
        .into_iter()
        .zip(table)
        .enumerate()
    {
        let d = e.parsed_dtype()?;
        if d.code() != code {
            return Err(WeightsError::DtypeTableMismatch {
                reason: format!(
                    "entry {i} (\"{}\", {}) has code {code:#04x} in the table, expected {:#04x}",
                    e.name,
                    e.dtype,
                    d.code()
                ),
            });
        }
    }
    Ok(())
}

impl WeightsFile {
    /// Check `manifest` against this file with every rule of the reader,
    /// and return it with what the check found. `ckalloc inspect`, `ckalloc
    /// load`, the demo and [`ArenaBuilder::manifest`](crate::ArenaBuilder::manifest)
    /// (which takes only a `CheckedManifest`) all rely on this one check.
    ///
    /// The rules, in order; the first broken one is the error:
    ///
    /// 1. **Manifest hash.** When the v5 metadata records `manifest_hash`
    ///    and the manifest was read from the JSON sidecar, the two digests
    ///    are equal ([`WeightsError::ManifestHashMismatch`]).
    /// 2. Every dtype name is known ([`WeightsError::UnknownDtype`]).
    /// 3. Every entry lies inside the tensor data `[tensor_data_start,
    ///    data_end)` ([`WeightsError::EntryOutsideFile`]).
    /// 4. No two entries share a byte; zero-size entries share nothing
    ///    ([`WeightsError::OverlappingEntries`]).
    /// 5. An entry with a shape stores at least the bytes its shape and
    ///    dtype need; more is allowed, converters pad rows
    ///    ([`WeightsError::ShapeMismatch`]).
    /// 6. Every `runtime_offset` equals its `file_offset`: the arena holds
    ///    each tensor at its file offset ([`WeightsError::RuntimeOffsetMismatch`]).
    /// 7. A manifest with no entries has no tensor data beyond the allowed
    ///    padding ([`WeightsError::EmptyManifest`]).
    /// 8. Names keep the writer's rule and are unique: true of every
    ///    [`Manifest`] by construction.
    /// 9. **Dtype table.** When the v5 metadata's `created_by` or the JSON's
    ///    `generator` names ckalloc, the table holds one code per entry in
    ///    file order, each the entry's dtype code
    ///    ([`WeightsError::DtypeTableMismatch`]). Other writers fill the
    ///    table from their own weight lists ([`DtypeTableCheck::Hint`]).
    /// 10. **Header fields.** Each `aligned_*` field is at least the count
    ///     it pads (C-Kernel-Engine's converters round each count up, as
    ///     [`ModelDims::fill_aligned_fp32`](super::ModelDims::fill_aligned_fp32)
    ///     does), and each count the v5 metadata's `config` records
    ///     as a number under the header field's name (`num_layers`,
    ///     `vocab_size`, `embed_dim`, `intermediate_size`, `context_length`,
    ///     `num_heads`, `num_kv_heads`, `head_dim`, and ckalloc's writer's
    ///     `model_type`, `aligned_*`, `num_merges`, `total_vocab_bytes`)
    ///     equals the header's. The header's fields lie outside every
    ///     layout's checksum range, while the footer's hash covers the
    ///     metadata. A disagreement is a [`ManifestWarning::HeaderDims`].
    ///
    /// Then, by `options`: [`require_manifest_hash`](CheckOptions::require_manifest_hash)
    /// refuses a manifest not bound by rule 1, and [`strict`](CheckOptions::strict)
    /// refuses every [`ManifestWarning`]. The allowed padding is the
    /// alignment the v5 metadata or the JSON records, when it is a power of
    /// two up to 1 GiB that every entry's offset and `data_end` keep, else
    /// C-Kernel-Engine's 64 bytes.
    ///
    /// # Errors
    /// The variants named above.
    pub fn check_manifest(
        &self,
        manifest: Manifest,
        options: CheckOptions,
    ) -> Result<CheckedManifest, WeightsError> {
        let meta = self.metadata_json();
        let meta_str = |key: &str| meta.and_then(|m| m.get(key)).and_then(|v| v.as_str());
        let (start, end) = (self.tensor_data_start(), self.data_end());

        // 1. What binds the manifest to the file.
        let binding = match (meta_str("manifest_hash"), manifest.json_sha256()) {
            (Some(recorded), Some(computed)) => {
                if super::error::hex32(computed) != recorded {
                    return Err(WeightsError::ManifestHashMismatch {
                        sidecar: manifest
                            .json_path()
                            .map_or_else(|| PathBuf::from(MANIFEST_JSON), |p| p.to_path_buf()),
                        recorded: recorded.to_string(),
                        computed: *computed,
                    });
                }
                ManifestBinding::ManifestHash
            }
            (Some(_), None) => ManifestBinding::HashUnchecked,
            (None, _) => ManifestBinding::Unbound {
                why: if self.version() == Version::V5 {
                    "the BUMPWGT5 metadata records no manifest_hash"
                } else {
                    "BUMPWGT3 and BUMPWGT4 files record no manifest hash"
                },
            },
        };
        // 2.
        for e in &manifest {
            e.parsed_dtype()?;
        }
        // 3.
        if let Some(e) = manifest
            .iter()
            .find(|e| e.file_offset < start || e.end().is_none_or(|x| x > end))
        {
            return Err(WeightsError::EntryOutsideFile {
                name: e.name.clone(),
                file_offset: e.file_offset,
                size: e.size,
                region_start: start,
                region_end: end,
            });
        }
        // 4.
        if let Some(o) = manifest.overlaps().into_iter().next() {
            return Err(WeightsError::OverlappingEntries {
                first: o.first,
                second: o.second,
                overlap_start: o.start,
                overlap_end: o.end,
            });
        }
        // 5.
        manifest.iter().try_for_each(check_shape)?;
        // 6.
        if let Some(e) = manifest.iter().find(|e| e.runtime_offset != e.file_offset) {
            return Err(WeightsError::RuntimeOffsetMismatch {
                name: e.name.clone(),
                file_offset: e.file_offset,
                runtime_offset: e.runtime_offset,
            });
        }
        // 7.
        let meta_alignment = meta
            .and_then(|m| m.get("alignment"))
            .and_then(|v| v.as_u64());
        let allowed = kept_alignment(meta_alignment, &manifest, end)
            .or(kept_alignment(manifest.alignment(), &manifest, end))
            .unwrap_or(CKE_ALIGNMENT);
        if manifest.is_empty() && end - start > allowed {
            return Err(WeightsError::EmptyManifest {
                region: (start, end),
                allowed,
            });
        }
        // 9.
        let created_by = meta_str("created_by");
        let ckalloc = |s: &str| s.starts_with("ckalloc");
        let table = self.dtype_table();
        let mut warnings = Vec::new();
        let dtype_table =
            if created_by.is_some_and(ckalloc) || manifest.generator().is_some_and(ckalloc) {
                table_matches(table, &manifest)?;
                DtypeTableCheck::Checked
            } else {
                // created_by is covered by the footer's hash, the generator only
                // by a verified manifest_hash.
                let producer_protected =
                    created_by.is_some() || binding == ManifestBinding::ManifestHash;
                if !producer_protected && table.len() == manifest.len() {
                    if let Err(WeightsError::DtypeTableMismatch { reason }) =
                        table_matches(table, &manifest)
                    {
                        warnings.push(ManifestWarning::UnprotectedDtypeTable { reason });
                    }
                }
                DtypeTableCheck::Hint {
                    note: self.dtype_table_note(&manifest),
                }
            };
        if binding == ManifestBinding::HashUnchecked {
            warnings.push(ManifestWarning::ManifestHashUnchecked);
        }
        // 10.
        if let Some(reason) = self.dims().disagreement(meta.and_then(|m| m.get("config"))) {
            warnings.push(ManifestWarning::HeaderDims { reason });
        }
        let layout = manifest.layout_report(start, end);
        warnings.extend(
            layout
                .gaps
                .into_iter()
                .filter(|g| g.end - g.start > allowed)
                .map(|gap| ManifestWarning::WideGap { gap, allowed }),
        );

        if options.require_manifest_hash && binding != ManifestBinding::ManifestHash {
            return Err(WeightsError::ManifestNotBound { binding });
        }
        if options.strict {
            if let Some(w) = warnings.first() {
                return Err(w.to_error());
            }
        }
        Ok(CheckedManifest {
            producer: self.producer(Some(&manifest)),
            manifest,
            container: self.container(),
            version: self.version(),
            binding,
            dtype_table,
            warnings,
            tensor_data: (start, end),
            path: self.path().map(|p| p.to_path_buf()),
            identity: self.identity(),
            fingerprint: Fingerprint {
                len: self.len(),
                checksum_offset: self.container().offsets().checksum,
                checksum: *self.checksum(),
            },
        })
    }
}

impl WeightsFile {
    /// One informational line comparing the dtype table with `manifest`, or
    /// `None` when the table has one slot per entry (in file order) with the
    /// code of the entry's dtype.
    ///
    /// C-Kernel-Engine's converters fill the table from their own weight list:
    /// GGUF converters keep a reserved `pos_emb` slot and list no tokenizer
    /// entries; the HF converters list bias slots the file does not hold; the
    /// safetensors converter codes i32/u8 tokenizer entries as 0. None of this
    /// is an error, since offsets and dtypes come from the manifest.
    pub(crate) fn dtype_table_note(&self, manifest: &Manifest) -> Option<String> {
        let slots = self.dtype_table().len();
        let entries = manifest.len();
        if slots != entries {
            return Some(format!(
                "table has {slots} slots, manifest {entries} entries: the converter fills the table \
                 from its own weight list, so offsets and dtypes come from the manifest"
            ));
        }
        let producer = self.producer(Some(manifest));
        let mut differ = manifest
            .sorted_by_offset()
            .into_iter()
            .zip(self.dtype_table())
            .enumerate()
            .filter(|(_, (e, &code))| !producer.slot_dtype(code).may_be(e.parsed_dtype().ok()));
        let (i, (first, &code)) = differ.next()?;
        let n = 1 + differ.count();
        Some(format!(
            "table has {slots} slots, manifest {entries} entries: {n} slot code(s) differ from the \
             manifest dtypes (first: slot {i}, \"{}\" {} coded {code}); the manifest's dtype names win",
            crate::Escaped::capped(&first.name, 80),
            crate::Escaped::capped(&first.dtype, 40)
        ))
    }
}
