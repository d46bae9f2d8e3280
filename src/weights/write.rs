//! Writing a [`WeightsWriter`]'s files: `weights.bump` (header, dtype
//! table, tensors, padding, v5 metadata and footer) and both sidecars.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::container::Version;
use super::dims::ModelDims;
use super::error::WeightsError;
use super::header::FOOTER_MAGIC;
use super::placement::PendingFile;
use super::sidecars::{MANIFEST_JSON, MANIFEST_MAP};
use super::writer::{
    Plan, WeightsWriter, WriteReport, CHECKSUM_OFFSET, DATA_START, WEIGHTS_FILE, WRITE_CHUNK,
};

impl WeightsWriter<'_> {
    /// Write `weights.bump`, `weights_manifest.json` and `weights_manifest.map` into
    /// `dir` (which must exist). See [`write_dir_with_progress`](Self::write_dir_with_progress).
    ///
    /// # Errors
    /// As [`write_dir_with_progress`](Self::write_dir_with_progress).
    pub fn write_dir(&self, dir: impl AsRef<Path>) -> Result<WriteReport, WeightsError> {
        self.write_dir_with_progress(dir, |_, _| {})
    }

    /// Write the three files into `dir`, calling `progress(done_bytes, total_bytes)`
    /// (bytes of `weights.bump`) at the start, every 4 MiB and at the end.
    ///
    /// Each file is written as an unnamed file (`O_TMPFILE`, Linux 3.11+ on ext4,
    /// XFS, Btrfs, tmpfs and most local filesystems) and linked into place once all
    /// three are complete and synced, so a process interrupted or killed while
    /// writing (even by `SIGKILL`) leaves no file behind. An existing file is
    /// replaced atomically (`rename(2)` from a fresh name): readers see the old
    /// file or the complete new one. `SIGINT`, `SIGTERM`, `SIGHUP` and `SIGQUIT`
    /// are blocked in the calling thread while the three names are placed, so an
    /// interruption never leaves a half-placed set (it takes effect right after)
    /// when no other thread can receive them: the kernel delivers a signal sent
    /// to the process to any thread that does not block it (`signal(7)`), so a
    /// program with other threads blocks these signals in them too, or handles
    /// them.
    ///
    /// On a filesystem without `O_TMPFILE` (NFS, FUSE, older kernels) each file
    /// is written under a temporary name `.NAME.tmp-PID-N` in `dir` and renamed
    /// into place; those names are removed on error, but a process killed while
    /// writing leaves them.
    ///
    /// On error existing files in `dir` are left as they were (names are placed
    /// last, after checking that none of them is a directory; a failure between
    /// two renames, such as a name turned into a directory meanwhile, can leave a
    /// new `weights.bump` with old sidecars, reported as the error). Not safe to run twice concurrently on the
    /// same `dir`.
    ///
    /// # Errors
    /// [`WeightsError::Io`] naming the file, [`WeightsError::SizeOverflow`],
    /// [`WeightsError::UnsupportedWriteVersion`] for [`Version::V3`].
    pub fn write_dir_with_progress(
        &self,
        dir: impl AsRef<Path>,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<WriteReport, WeightsError> {
        let dir = dir.as_ref();
        if !matches!(self.version, Version::V4 | Version::V5) {
            return Err(WeightsError::UnsupportedWriteVersion {
                version: self.version.number(),
            });
        }
        let plan = self.plan()?;
        let manifest_json = self.manifest_json(&plan);
        let metadata = match self.version {
            Version::V5 => Some(self.metadata(&manifest_json)),
            _ => None,
        };
        let meta_len = metadata
            .as_ref()
            .map_or(0, |m| m.len() as u64 + super::header::FOOTER_SIZE);
        let file_len = plan
            .data_end
            .checked_add(meta_len)
            .ok_or_else(|| WeightsError::overflow("file length"))?;

        let final_paths = [
            dir.join(WEIGHTS_FILE),
            dir.join(MANIFEST_JSON),
            dir.join(MANIFEST_MAP),
        ];
        let mut bump = PendingFile::create(dir, WEIGHTS_FILE)?;
        let checksum = self.write_bump(
            &mut bump.file,
            &final_paths[0],
            &plan,
            metadata.as_deref(),
            file_len,
            &mut progress,
        )?;
        let mut json =
            serde_json::to_vec_pretty(&manifest_json).map_err(|source| WeightsError::Json {
                what: "manifest",
                source,
            })?;
        json.push(b'\n');
        let json_file = write_small(dir, MANIFEST_JSON, &json)?;
        let map_file = write_small(
            dir,
            MANIFEST_MAP,
            plan.manifest.to_map_string(self.version).as_bytes(),
        )?;
        // A directory at one of the names would fail its `rename(2)` with
        // `EISDIR` after the names before it were placed: refuse before
        // placing any.
        for dest in &final_paths {
            if std::fs::symlink_metadata(dest).is_ok_and(|m| m.is_dir()) {
                return Err(WeightsError::io(
                    dest,
                    "rename",
                    std::io::ErrorKind::IsADirectory.into(),
                ));
            }
        }
        {
            // The three names appear together: Ctrl-C or `kill` arriving
            // meanwhile takes effect after the last one (SIGKILL cannot wait).
            let _signals = crate::sys::block_termination_signals();
            for (f, dest) in [bump, json_file, map_file].into_iter().zip(&final_paths) {
                f.commit(dest)?;
            }
        }
        let [weights_path, manifest_json_path, manifest_map_path] = final_paths;
        Ok(WriteReport {
            weights_path,
            manifest_json_path,
            manifest_map_path,
            weights_base: plan.weights_base,
            data_end: plan.data_end,
            file_len,
            checksum,
            manifest: plan.manifest,
        })
    }

    fn write_bump(
        &self,
        file: &mut File,
        path: &Path,
        plan: &Plan,
        metadata: Option<&[u8]>,
        file_len: u64,
        progress: &mut impl FnMut(u64, u64),
    ) -> Result<[u8; 32], WeightsError> {
        let io = |op| move |e| WeightsError::io(path, op, e);
        let mut out = HashingWriter {
            inner: BufWriter::with_capacity(1 << 20, file),
            hasher: Sha256::new(),
            pos: 0,
            total: file_len,
        };
        progress(0, file_len);
        // Header placeholder and the zero extended-metadata block: not hashed.
        out.write_plain(&[0u8; DATA_START as usize])
            .map_err(io("write"))?;
        out.write_hashed(&(self.tensors.len() as u32).to_le_bytes())
            .map_err(io("write"))?;
        let table: Vec<u8> = self.tensors.iter().map(|t| t.dtype.code()).collect();
        out.write_hashed(&table).map_err(io("write"))?;
        for (t, e) in self.tensors.iter().zip(plan.manifest.iter()) {
            out.pad_to(e.file_offset).map_err(io("write"))?;
            for chunk in t.data.chunks(WRITE_CHUNK) {
                out.write_hashed(chunk).map_err(io("write"))?;
                progress(out.pos, file_len);
            }
        }
        out.pad_to(plan.data_end).map_err(io("write"))?;
        let checksum: [u8; 32] = out.hasher.clone().finalize().into();
        if let Some(meta) = metadata {
            out.write_plain(meta).map_err(io("write"))?;
            out.write_plain(&FOOTER_MAGIC).map_err(io("write"))?;
            out.write_plain(&(meta.len() as u64).to_le_bytes())
                .map_err(io("write"))?;
            let meta_hash: [u8; 32] = Sha256::digest(meta).into();
            out.write_plain(&meta_hash).map_err(io("write"))?;
        }
        debug_assert_eq!(out.pos, file_len);
        let file = out
            .inner
            .into_inner()
            .map_err(|e| WeightsError::io(path, "write", e.into_error()))?;
        file.seek(SeekFrom::Start(0)).map_err(io("seek"))?;
        file.write_all(&encode_fixed_header(self.version, &self.dims, &checksum))
            .map_err(io("write"))?;
        file.sync_all().map_err(io("fsync"))?;
        progress(file_len, file_len);
        Ok(checksum)
    }
}

/// The first [`DATA_START`] bytes of a file with these fields: magic, version,
/// dims, checksum, then zeros up to offset 152.
fn encode_fixed_header(version: Version, dims: &ModelDims, checksum: &[u8; 32]) -> Vec<u8> {
    let mut h = Vec::with_capacity(DATA_START as usize);
    h.extend_from_slice(&version.magic());
    for v in [
        version.number(),
        dims.model_type,
        dims.num_layers,
        dims.vocab_size,
        dims.embed_dim,
        dims.intermediate_size,
        dims.context_len,
        dims.num_heads,
        dims.num_kv_heads,
        dims.head_dim,
    ] {
        h.extend_from_slice(&v.to_le_bytes());
    }
    for v in [
        dims.aligned_embed_dim,
        dims.aligned_head_dim,
        dims.aligned_intermediate,
        dims.aligned_context,
    ] {
        h.extend_from_slice(&v.to_le_bytes());
    }
    h.extend_from_slice(&dims.num_merges.to_le_bytes());
    h.extend_from_slice(&dims.total_vocab_bytes.to_le_bytes());
    debug_assert_eq!(h.len() as u64, CHECKSUM_OFFSET);
    h.extend_from_slice(checksum);
    h.resize(DATA_START as usize, 0);
    h
}

/// Write `bytes` as the pending file `name` in `dir`, synced.
fn write_small(dir: &Path, name: &'static str, bytes: &[u8]) -> Result<PendingFile, WeightsError> {
    let path = dir.join(name);
    let mut f = PendingFile::create(dir, name)?;
    f.file
        .write_all(bytes)
        .map_err(|e| WeightsError::io(&path, "write", e))?;
    f.file
        .sync_all()
        .map_err(|e| WeightsError::io(&path, "fsync", e))?;
    Ok(f)
}

struct HashingWriter<'f> {
    inner: BufWriter<&'f mut File>,
    hasher: Sha256,
    pos: u64,
    total: u64,
}

impl HashingWriter<'_> {
    fn write_plain(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(b)?;
        self.pos += b.len() as u64;
        debug_assert!(self.pos <= self.total);
        Ok(())
    }

    fn write_hashed(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.hasher.update(b);
        self.write_plain(b)
    }

    fn pad_to(&mut self, offset: u64) -> std::io::Result<()> {
        const ZEROS: [u8; 4096] = [0; 4096];
        while self.pos < offset {
            let n = (offset - self.pos).min(ZEROS.len() as u64) as usize;
            self.write_hashed(&ZEROS[..n])?;
        }
        Ok(())
    }
}
