//! A model file into an arena: write a small `weights.bump` with the crate's
//! writer, check its manifest against it, build a [`BumpArena`] over it
//! (arena offset == file offset), read a weight matrix in place and put the
//! activations in the runtime region with `Vec::new_in(&arena)`.
//!
//! Run: `cargo run --release --example arena_weights`

use allocator_api2::vec::Vec;
use ckalloc::weights::{CheckOptions, Dtype, Version, WeightsFile, WeightsWriter};
use ckalloc::{BumpArena, ModePolicy};

const ROWS: usize = 256;
const COLS: usize = 256;

fn f32_bytes(values: impl Iterator<Item = f32>) -> std::vec::Vec<u8> {
    values.flat_map(f32::to_le_bytes).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. A model file: a ROWS x COLS weight matrix and a bias, little-endian f32.
    let dir = tempfile::tempdir()?;
    let weight = f32_bytes((0..ROWS * COLS).map(|i| (i % 7) as f32 * 0.25));
    let bias = f32_bytes((0..ROWS).map(|i| i as f32));
    let mut writer = WeightsWriter::new(Version::V5);
    writer.add_tensor_with_shape(
        "layer0.weight",
        Dtype::F32,
        &[ROWS as u64, COLS as u64],
        &weight[..],
    )?;
    writer.add_tensor_with_shape("layer0.bias", Dtype::F32, &[ROWS as u64], &bias[..])?;
    let report = writer.write_dir(dir.path())?;
    println!(
        "wrote {} ({} bytes; tensors in [{}, {}))",
        report.weights_path.display(),
        report.file_len,
        report.weights_base,
        report.data_end
    );

    // 2. Check the file and its manifest: the tensor checksum, then every
    //    rule of the reader. A BUMPWGT5 file records the SHA-256 of its JSON
    //    manifest, so the manifest can be required to be the one written with it.
    let file = WeightsFile::open(&report.weights_path)?;
    file.verify_checksum()?;
    let manifest = file.check_manifest(
        file.load_manifest(dir.path())?,
        CheckOptions::new().require_manifest_hash(true),
    )?;
    println!("manifest: {}", manifest.binding());

    // 3. The arena: weights region [weights_base, data_end), then 16 MiB of runtime region.
    let (weights_base, activations_base) = manifest.weights_region();
    let weights_base = usize::try_from(weights_base)?;
    let activations_base = usize::try_from(activations_base)?;
    let mut arena = BumpArena::builder(activations_base + (16 << 20))
        .weights_file(&report.weights_path)
        .weights_base(weights_base)
        .activations_base(activations_base)
        .policy(ModePolicy::Auto) // anonymous huge-page memory first, the file mapped as fallback
        .manifest(manifest)
        .build()?;
    if arena.needs_weight_materialization() {
        arena.materialize_weights()?; // anonymous mode: copy the file's bytes in
    }
    println!("arena: {} mode, {} backing", arena.mode(), arena.backing());

    // 4. y = W x + b, reading W and b in place; y lives in the runtime region.
    let w = arena.tensor("layer0.weight").ok_or("no layer0.weight")?;
    let b = arena.tensor("layer0.bias").ok_or("no layer0.bias")?;
    let read =
        |bytes: &[u8], i: usize| f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
    let x: std::vec::Vec<f32> = (0..COLS).map(|i| 1.0 / (1 + i) as f32).collect();
    let mut y: Vec<f32, _> = Vec::new_in(&arena);
    for r in 0..ROWS {
        let dot: f32 = (0..COLS).map(|c| read(w, r * COLS + c) * x[c]).sum();
        y.push(dot + read(b, r));
    }
    let y_offset = arena
        .offset_of(y.as_ptr().cast())
        .ok_or("y outside the arena")?;
    assert!(y_offset >= arena.activations_base());
    println!(
        "y[0..4] = {:?}; y at arena offset {y_offset}, {} bytes of runtime region used",
        &y[..4],
        arena.used()
    );

    // 5. Nothing from the runtime region is alive after `drop(y)`: reset it for the next request.
    drop(y);
    arena.reset();
    assert_eq!(arena.used(), 0);
    Ok(())
}
