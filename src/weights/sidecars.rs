//! The sidecar manifests: `weights_manifest.map` and `weights_manifest.json`,
//! read ([`Manifest::from_map`], [`Manifest::from_json`],
//! [`Manifest::load_sidecars`]) and written ([`Manifest::to_map_string`],
//! [`Manifest::entries_json`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::bytes::open_regular_file;
use super::canonical::canonical_json;
use super::container::Version;
use super::entry::{check_name, ManifestEntry};
use super::error::{ManifestKind, WeightsError};
use super::manifest::Manifest;

/// File name of the JSON sidecar.
pub const MANIFEST_JSON: &str = "weights_manifest.json";
/// File name of the line-based sidecar.
pub const MANIFEST_MAP: &str = "weights_manifest.map";
/// The largest sidecar [`Manifest::load_sidecars`] reads (bytes): a manifest
/// of a million tensors takes about a tenth of it.
pub const MAX_SIDECAR_BYTES: u64 = 256 << 20;

/// Read a small text file beside a weights file (a sidecar manifest, a
/// `config.json`) the way [`Manifest::load_sidecars`] reads its sidecars:
/// `Ok(None)` when it does not exist; only a regular file (a FIFO, a
/// directory or a device such as `/dev/zero` in its place is refused, and
/// opening never blocks); at most `max_bytes` long; UTF-8.
///
/// # Errors
/// [`WeightsError::NotARegularFile`], [`WeightsError::SidecarTooLarge`],
/// [`WeightsError::Io`] (also for text that is not UTF-8).
pub fn read_text_file(path: &Path, max_bytes: u64) -> Result<Option<String>, WeightsError> {
    use std::io::Read as _;
    let (file, meta) = match open_regular_file(path) {
        Ok(opened) => opened,
        Err(WeightsError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    if meta.len() > max_bytes {
        return Err(WeightsError::SidecarTooLarge {
            path: path.to_path_buf(),
            len: meta.len(),
            max: max_bytes,
        });
    }
    let mut text = String::new();
    file.take(max_bytes)
        .read_to_string(&mut text)
        .map_err(|e| WeightsError::io(path, "read", e))?;
    Ok(Some(text))
}

/// Parse an offset/size field: `0x`/`0X` hexadecimal or decimal. A decimal with a
/// leading zero (`0123`) is rejected because C-Kernel-Engine's C loader
/// (`strtoull(s, NULL, 0)`) would read it as octal.
fn parse_number(s: &str) -> Result<u64, String> {
    let t = s.trim_matches(|c: char| c == ' ' || c == '\t');
    let shown = crate::Escaped::capped(s, 40);
    let (digits, radix) = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => (h, 16),
        None => (t, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(format!(
            "\"{shown}\" is not a decimal or 0x-hexadecimal number"
        ));
    }
    if radix == 10 && digits.len() > 1 && digits.starts_with('0') {
        return Err(format!(
            "\"{shown}\" has a leading zero (C readers would take it as octal)"
        ));
    }
    u64::from_str_radix(digits, radix).map_err(|_| format!("\"{shown}\" does not fit in 64 bits"))
}

/// An entry of the JSON manifest. Its numbers stay JSON values until
/// [`Manifest::from_json`] reads them: an unsigned integer or a string in
/// `.map` syntax, anything else an error naming the entry and the field.
#[derive(Deserialize)]
struct JsonEntry {
    name: String,
    dtype: String,
    #[serde(alias = "offset")]
    file_offset: serde_json::Value,
    size: serde_json::Value,
    #[serde(default)]
    runtime_offset: Option<serde_json::Value>,
    #[serde(default)]
    shape: Option<Vec<u64>>,
}

#[derive(Deserialize)]
struct JsonManifest {
    /// Read one by one, so that an error names its entry.
    entries: Vec<serde_json::Value>,
    #[serde(default)]
    format: Option<serde_json::Value>,
    #[serde(default)]
    generator: Option<serde_json::Value>,
    #[serde(default)]
    alignment: Option<serde_json::Value>,
}

fn json_err(message: String) -> WeightsError {
    WeightsError::ManifestSyntax {
        kind: ManifestKind::Json,
        line: 0,
        message,
    }
}

/// A sidecar's message text: the parser's error cut to 200 characters (it
/// may quote a whole string value).
fn parser_message(e: &serde_json::Error) -> String {
    crate::Escaped::capped(&e.to_string(), 200).to_string()
}

/// An entry error of [`Manifest::from_entries`], named after the sidecar
/// the entries came from.
fn from_sidecar(e: WeightsError, kind: ManifestKind) -> WeightsError {
    match e {
        WeightsError::ManifestSyntax {
            kind: ManifestKind::Entries,
            line,
            message,
        } => WeightsError::ManifestSyntax {
            kind,
            line,
            message,
        },
        e => e,
    }
}

impl Manifest {
    /// Parse `weights_manifest.map`: one `name|dtype|FILE_OFFSET|SIZE|RUNTIME_OFFSET`
    /// per line, numbers as `0x` hex (what writers emit) or decimal; empty lines
    /// and lines starting with `#` (such as the first line
    /// `# ck-bumpwgt5-manifest-map v1`) are skipped; a trailing `\r` is removed.
    ///
    /// Stricter than C-Kernel-Engine's C loader, which ignores extra fields and
    /// collapses empty ones: here a line must have exactly five fields, a name
    /// that keeps [`check_name`], a non-empty dtype, and numbers without an
    /// octal-looking leading zero.
    ///
    /// # Errors
    /// [`WeightsError::ManifestSyntax`] with the 1-based line number;
    /// [`WeightsError::InvalidTensorName`]; [`WeightsError::DuplicateTensor`].
    pub fn from_map(text: &str) -> Result<Manifest, WeightsError> {
        let mut entries = Vec::new();
        for (i, raw) in text.split('\n').enumerate() {
            let line = raw.strip_suffix('\r').unwrap_or(raw);
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |message: String| WeightsError::ManifestSyntax {
                kind: ManifestKind::Map,
                line: i + 1,
                message,
            };
            let shown = crate::Escaped::capped(line, 80);
            let fields: Vec<&str> = line.split('|').collect();
            if fields.len() != 5 {
                return Err(err(format!(
                    "expected 5 fields name|dtype|file_offset|size|runtime_offset, found {} in \"{shown}\"",
                    fields.len(),
                )));
            }
            if fields[0].is_empty() || fields[1].is_empty() {
                return Err(err(format!("empty name or dtype in \"{shown}\"")));
            }
            check_name(fields[0])?;
            let file_offset =
                parse_number(fields[2]).map_err(|m| err(format!("file_offset: {m}")))?;
            let size = parse_number(fields[3]).map_err(|m| err(format!("size: {m}")))?;
            let runtime_offset =
                parse_number(fields[4]).map_err(|m| err(format!("runtime_offset: {m}")))?;
            entries.push(ManifestEntry {
                name: fields[0].to_owned(),
                dtype: fields[1].to_owned(),
                file_offset,
                size,
                runtime_offset,
                shape: None,
            });
        }
        Manifest::from_entries(entries).map_err(|e| from_sidecar(e, ManifestKind::Map))
    }

    /// Parse `weights_manifest.json`: an object whose `entries` array holds objects
    /// with `name`, `dtype`, `file_offset` (alias `offset`), `size`, and optionally
    /// `runtime_offset` (default: `file_offset`) and `shape`. Numbers may be JSON
    /// integers or strings in `.map` syntax. `format`, `generator` and
    /// `alignment` are kept; other keys (C-Kernel-Engine writes `config`,
    /// `template`, `bump_layout`...) are read but not interpreted. Names keep
    /// [`check_name`].
    ///
    /// The SHA-256 of the whole document in canonical form
    /// ([`canonical_json`](super::canonical_json)) is kept
    /// ([`json_sha256`](Self::json_sha256)): the v5 metadata's
    /// `manifest_hash` is compared with it.
    ///
    /// # Errors
    /// [`WeightsError::ManifestSyntax`] (with the parser's line),
    /// [`WeightsError::InvalidTensorName`] or [`WeightsError::DuplicateTensor`].
    pub fn from_json(text: &str) -> Result<Manifest, WeightsError> {
        let doc: serde_json::Value =
            serde_json::from_str(text).map_err(|e| WeightsError::ManifestSyntax {
                kind: ManifestKind::Json,
                line: e.line(),
                message: parser_message(&e),
            })?;
        if !doc.is_object() {
            return Err(json_err(
                "the manifest is not a JSON object with an \"entries\" array".into(),
            ));
        }
        let json_sha256: [u8; 32] = Sha256::digest(canonical_json(&doc)).into();
        let raw: JsonManifest =
            serde_json::from_value(doc).map_err(|e| json_err(parser_message(&e)))?;
        let num = |n: serde_json::Value, what: &str, name: &str| -> Result<u64, WeightsError> {
            let message = match &n {
                serde_json::Value::String(s) => match parse_number(s) {
                    Ok(x) => return Ok(x),
                    Err(m) => m,
                },
                v => match v.as_u64() {
                    Some(x) => return Ok(x),
                    None => format!(
                        "{} is neither an unsigned integer nor a string in .map syntax",
                        crate::Escaped::capped(&v.to_string(), 40)
                    ),
                },
            };
            Err(json_err(format!(
                "entry \"{}\" {what}: {message}",
                crate::Escaped::capped(name, 80)
            )))
        };
        let mut entries = Vec::with_capacity(raw.entries.len());
        for (i, e) in raw.entries.into_iter().enumerate() {
            let e: JsonEntry = serde_json::from_value(e)
                .map_err(|err| json_err(format!("entry {i}: {}", parser_message(&err))))?;
            if e.name.is_empty() || e.dtype.is_empty() {
                return Err(json_err(format!(
                    "entry \"{}\": empty name or dtype",
                    crate::Escaped::capped(&e.name, 80)
                )));
            }
            check_name(&e.name)?;
            let file_offset = num(e.file_offset, "file_offset", &e.name)?;
            let size = num(e.size, "size", &e.name)?;
            let runtime_offset = match e.runtime_offset {
                Some(r) => num(r, "runtime_offset", &e.name)?,
                None => file_offset,
            };
            entries.push(ManifestEntry {
                name: e.name,
                dtype: e.dtype,
                file_offset,
                size,
                runtime_offset,
                shape: e.shape,
            });
        }
        let text = |v: Option<serde_json::Value>| match v {
            Some(serde_json::Value::String(s)) => Some(s),
            _ => None,
        };
        let mut m =
            Manifest::from_entries(entries).map_err(|e| from_sidecar(e, ManifestKind::Json))?;
        m.format = text(raw.format);
        m.generator = text(raw.generator);
        m.alignment = raw.alignment.and_then(|v| v.as_u64());
        m.json_sha256 = Some(json_sha256);
        Ok(m)
    }

    /// Load the sidecars from `dir`. With both present, the `.map` gives order,
    /// the `.json` gives shapes, and the two must list the same tensors with
    /// every field equal (name, dtype as written, file offset, size, runtime
    /// offset). With one present, that one.
    ///
    /// Only regular files are read (a FIFO or a device in place of a sidecar
    /// is refused without blocking), of at most [`MAX_SIDECAR_BYTES`], and
    /// both must be UTF-8.
    ///
    /// # Errors
    /// [`WeightsError::MissingSidecars`] if neither exists; [`WeightsError::Io`]
    /// (also for a sidecar that is not UTF-8); [`WeightsError::NotARegularFile`];
    /// [`WeightsError::SidecarTooLarge`];
    /// parse errors; [`WeightsError::SidecarMismatch`].
    pub fn load_sidecars(dir: impl AsRef<Path>) -> Result<Manifest, WeightsError> {
        let dir = dir.as_ref();
        let read = |name: &str| -> Result<Option<(String, PathBuf)>, WeightsError> {
            let p = dir.join(name);
            Ok(read_text_file(&p, MAX_SIDECAR_BYTES)?.map(|t| (t, p)))
        };
        let map = read(MANIFEST_MAP)?
            .map(|(t, _)| Manifest::from_map(&t))
            .transpose()?;
        let json = match read(MANIFEST_JSON)? {
            Some((t, p)) => {
                let mut j = Manifest::from_json(&t)?;
                j.json_path = Some(p);
                Some(j)
            }
            None => None,
        };
        match (map, json) {
            (None, None) => Err(WeightsError::MissingSidecars {
                dir: dir.to_path_buf(),
            }),
            (Some(m), None) => Ok(m),
            (None, Some(j)) => Ok(j),
            (Some(mut m), Some(j)) => {
                if m.len() != j.len() {
                    return Err(WeightsError::SidecarMismatch {
                        name: "*".into(),
                        reason: format!("map lists {} tensors, json lists {}", m.len(), j.len()),
                    });
                }
                for e in &mut m.entries {
                    let mismatch = |reason: String| WeightsError::SidecarMismatch {
                        name: e.name.clone(),
                        reason,
                    };
                    let Some(je) = j.get(&e.name) else {
                        return Err(mismatch("missing from the json".into()));
                    };
                    if e.dtype != je.dtype {
                        return Err(mismatch(format!(
                            "dtype \"{}\" vs \"{}\"",
                            crate::Escaped::capped(&e.dtype, 40),
                            crate::Escaped::capped(&je.dtype, 40)
                        )));
                    }
                    let (a, b) = (
                        (e.file_offset, e.size, e.runtime_offset),
                        (je.file_offset, je.size, je.runtime_offset),
                    );
                    if a != b {
                        return Err(mismatch(format!(
                            "file_offset/size/runtime_offset {:#x}/{:#x}/{:#x} vs {:#x}/{:#x}/{:#x}",
                            a.0, a.1, a.2, b.0, b.1, b.2
                        )));
                    }
                    e.shape = je.shape.clone();
                }
                m.format = j.format;
                m.generator = j.generator;
                m.alignment = j.alignment;
                m.json_sha256 = j.json_sha256;
                m.json_path = j.json_path;
                Ok(m)
            }
        }
    }

    /// The `.map` text: `# ck-bumpwgt{4,5}-manifest-map v1`, a comment naming the
    /// columns, then one line per entry in manifest order with numbers as
    /// `0x%016X`, like C-Kernel-Engine's `build_ir` scripts.
    pub fn to_map_string(&self, version: Version) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# ck-bumpwgt{}-manifest-map v1", version.number());
        s.push_str("# name|dtype|file_offset|size|runtime_offset\n");
        for e in &self.entries {
            let _ = writeln!(
                s,
                "{}|{}|0x{:016X}|0x{:016X}|0x{:016X}",
                e.name, e.dtype, e.file_offset, e.size, e.runtime_offset
            );
        }
        s
    }

    /// The `entries` array of the JSON sidecar.
    pub fn entries_json(&self) -> serde_json::Value {
        serde_json::Value::Array(
            self.entries
                .iter()
                .map(|e| {
                    let mut o = serde_json::Map::new();
                    o.insert("name".into(), e.name.clone().into());
                    o.insert("dtype".into(), e.dtype.clone().into());
                    o.insert("file_offset".into(), e.file_offset.into());
                    o.insert("size".into(), e.size.into());
                    if e.runtime_offset != e.file_offset {
                        o.insert("runtime_offset".into(), e.runtime_offset.into());
                    }
                    if let Some(shape) = &e.shape {
                        o.insert("shape".into(), shape.clone().into());
                    }
                    serde_json::Value::Object(o)
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(parse_number("0x00000000000000FF"), Ok(255));
        assert_eq!(parse_number("0Xff"), Ok(255));
        assert_eq!(parse_number("0"), Ok(0));
        assert_eq!(parse_number("152"), Ok(152));
        assert!(parse_number("0152").is_err());
        assert!(parse_number("0x").is_err());
        assert!(parse_number("-1").is_err());
        assert!(parse_number("+1").is_err());
        assert!(parse_number("0x1_0").is_err());
        assert!(parse_number("0x10000000000000000").is_err());
    }
}
