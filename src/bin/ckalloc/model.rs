//! Reading a model: `model.safetensors` mapped read-only, and the
//! `config.json` beside it.

use crate::error::{err, CliError};
use crate::fail;
use crate::sigbus;
use ckalloc::weights::{read_text_file, WeightsError};
use indicatif::BinaryBytes;
use safetensors::{Dtype as StDtype, SafeTensors};
use std::fs::File;
use std::path::{Path, PathBuf};

/// The largest `config.json` read next to a model (bytes); real ones are a
/// few KiB.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// A `model.safetensors` file mapped read-only. A `SIGBUS` in the mapping
/// (the file truncated underneath) is one error line and exit 1
/// ([`sigbus`](crate::sigbus)).
pub struct Model {
    pub path: PathBuf,
    map: memmap2::Mmap,
    _watch: sigbus::Watch,
}

/// One tensor of a safetensors file, borrowed from the mapping.
pub struct Tensor<'a> {
    pub name: String,
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    pub data: &'a [u8],
}

impl Model {
    /// Map `path` read-only. The file must be a regular, non-empty file.
    pub fn open(path: &Path) -> Result<Model, CliError> {
        let meta = std::fs::metadata(path).map_err(|e| err(format!("{}: {e}", path.display())))?;
        if !meta.is_file() {
            fail!("{}: not a regular file", path.display());
        }
        if meta.len() < 8 {
            fail!(
                "{}: not a safetensors file ({} bytes, shorter than the 8-byte header length)",
                path.display(),
                meta.len()
            );
        }
        let file = File::open(path).map_err(|e| err(format!("{}: {e}", path.display())))?;
        // SAFETY: the mapping is read-only and private to this process. If
        // another process truncated the file while it is mapped, reads past
        // the new end would raise SIGBUS; ckalloc only reads model files it was
        // pointed at, as the safetensors tools themselves do.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| err(format!("{}: cannot map: {e}", path.display())))?;
        let watch = sigbus::watch(
            map.as_ptr(),
            map.len(),
            0,
            &format!("{} (the model, mapped)", path.display()),
        );
        Ok(Model {
            path: path.to_path_buf(),
            map,
            _watch: watch,
        })
    }

    /// The parsed header (validated by the `safetensors` crate: offsets cover
    /// the buffer, shapes match sizes, dtypes are known).
    pub fn parse(&self) -> Result<SafeTensors<'_>, CliError> {
        SafeTensors::deserialize(&self.map).map_err(|e| {
            err(format!(
                "{}: not a valid safetensors file: {e}",
                self.path.display()
            ))
        })
    }

    /// Every tensor, in file order (by data offset, then name).
    pub fn tensors(&self) -> Result<Vec<Tensor<'_>>, CliError> {
        let st = self.parse()?;
        let base = self.map.as_ptr() as usize;
        let mut v: Vec<Tensor<'_>> = st
            .iter()
            .map(|(name, view)| Tensor {
                name: name.to_string(),
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                data: view.data(),
            })
            .collect();
        v.sort_by(|a, b| {
            (a.data.as_ptr() as usize - base, &a.name)
                .cmp(&(b.data.as_ptr() as usize - base, &b.name))
        });
        Ok(v)
    }

    /// `config.json` next to the model, if there is one: (path, text). Only
    /// a regular file of at most 16 MiB is read (not a FIFO, which would
    /// block, a directory, or a device such as `/dev/zero` that never ends).
    pub fn config_json(&self) -> Result<Option<(PathBuf, String)>, CliError> {
        let p = self
            .path
            .parent()
            .unwrap_or(Path::new("."))
            .join("config.json");
        match read_text_file(&p, MAX_CONFIG_BYTES) {
            Ok(text) => Ok(text.map(|t| (p, t))),
            Err(e) => Err(config_error(&p, e)),
        }
    }
}

/// A failure to read `config.json` as one line naming it once.
fn config_error(p: &Path, e: WeightsError) -> CliError {
    match e {
        WeightsError::Io { source, .. } => err(format!("{}: {source}", p.display())),
        WeightsError::NotARegularFile { .. } => err(format!("{}: not a regular file", p.display())),
        WeightsError::SidecarTooLarge { len, max, .. } => err(format!(
            "{}: {len} bytes, larger than the {} a config.json may have",
            p.display(),
            BinaryBytes(max)
        )),
        e => err(format!("{}: {e}", p.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages for a `config.json` that cannot be read (the library's
    /// `read_text_file` errors, worded as the tool always worded them).
    #[test]
    fn config_json_errors_name_the_file_once() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model.safetensors");
        std::fs::write(&model, [0u8; 16]).unwrap();
        let m = Model::open(&model).unwrap();
        let cfg = dir.path().join("config.json");
        let shown = cfg.display().to_string();
        let msg = |m: &Model| m.config_json().err().map(|e| e.to_string());

        assert!(m.config_json().unwrap().is_none(), "missing: none");

        std::fs::write(&cfg, "{}").unwrap();
        assert_eq!(m.config_json().unwrap(), Some((cfg.clone(), "{}".into())));

        std::fs::write(&cfg, [b'{', 0xff, b'}']).unwrap();
        assert_eq!(
            msg(&m).unwrap(),
            format!("{shown}: stream did not contain valid UTF-8")
        );

        std::fs::File::create(&cfg)
            .unwrap()
            .set_len(MAX_CONFIG_BYTES + 1)
            .unwrap();
        assert_eq!(
            msg(&m).unwrap(),
            format!("{shown}: 16777217 bytes, larger than the 16.00 MiB a config.json may have")
        );

        std::fs::remove_file(&cfg).unwrap();
        std::fs::create_dir(&cfg).unwrap();
        assert_eq!(msg(&m).unwrap(), format!("{shown}: not a regular file"));

        std::fs::remove_dir(&cfg).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &cfg).unwrap();
        assert_eq!(msg(&m).unwrap(), format!("{shown}: not a regular file"));
    }
}
