//! IREE's memory type and buffer usage bit sets (`iree_hal_memory_type_t`,
//! `iree_hal_buffer_usage_t`), as [`bitflags`](mod@bitflags) types with IREE's bit values.
//!
//! The constants are declared in display order (composites first), so
//! [`Display`](fmt::Display) writes the shortest name-based spelling; the
//! spec parser accepts exactly the constant names, in any case.

use std::fmt;

use bitflags::{bitflags, Flags};

/// A set of IREE memory type bits (`iree_hal_memory_type_t`).
///
/// A value built from the named constants and `|` has a name-based spelling,
/// and [`Display`](fmt::Display) round-trips through the spec parser. Bits
/// without a name (reachable through `from_bits_retain`) are written as a
/// hexadecimal remainder, which the spec parser rejects.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MemoryType(u32);

bitflags! {
    impl MemoryType: u32 {
        /// `host_local`: ordinary host memory (host_visible | host_coherent | bit 6).
        const HOST_LOCAL = (1 << 1) | (1 << 2) | (1 << 6);
        /// `device_local`: the fastest memory for the device (device_visible | bit 5).
        const DEVICE_LOCAL = (1 << 4) | (1 << 5);
        /// `optimal`: an allocation-time hint; every heap satisfies it.
        const OPTIMAL = 1 << 0;
        /// `host_visible`: the host can map the memory.
        const HOST_VISIBLE = 1 << 1;
        /// `host_coherent`: no flush/invalidate is needed between host and device.
        const HOST_COHERENT = 1 << 2;
        /// `host_cached`: host accesses go through the CPU caches.
        const HOST_CACHED = 1 << 3;
        /// `device_visible`: the device can use the memory for execution.
        const DEVICE_VISIBLE = 1 << 4;
    }
}

impl MemoryType {
    /// No bits: in a heap key this is the wildcard `*`.
    pub const NONE: MemoryType = MemoryType::empty();
}

/// A set of IREE buffer usage bits (`iree_hal_buffer_usage_t`).
///
/// Spelling and round-trip as for [`MemoryType`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BufferUsage(u32);

bitflags! {
    impl BufferUsage: u32 {
        /// `dispatch` (every dispatch bit).
        const DISPATCH = 0b11_1111 << 8;
        /// `transfer` (source | target).
        const TRANSFER = 0b11;
        /// `dispatch_storage` (read | write).
        const DISPATCH_STORAGE = (1 << 10) | (1 << 11);
        /// `dispatch_image` (read | write).
        const DISPATCH_IMAGE = (1 << 12) | (1 << 13);
        /// `mapping` (scoped | access_random).
        const MAPPING = (1 << 24) | (1 << 27);
        /// `transfer_source`.
        const TRANSFER_SOURCE = 1 << 0;
        /// `transfer_target`.
        const TRANSFER_TARGET = 1 << 1;
        /// `dispatch_indirect_params`.
        const DISPATCH_INDIRECT_PARAMS = 1 << 8;
        /// `dispatch_uniform_read`.
        const DISPATCH_UNIFORM_READ = 1 << 9;
        /// `dispatch_storage_read`.
        const DISPATCH_STORAGE_READ = 1 << 10;
        /// `dispatch_storage_write`.
        const DISPATCH_STORAGE_WRITE = 1 << 11;
        /// `dispatch_image_read`.
        const DISPATCH_IMAGE_READ = 1 << 12;
        /// `dispatch_image_write`.
        const DISPATCH_IMAGE_WRITE = 1 << 13;
        /// `sharing_export`.
        const SHARING_EXPORT = 1 << 16;
        /// `sharing_replicate`.
        const SHARING_REPLICATE = 1 << 17;
        /// `sharing_concurrent`.
        const SHARING_CONCURRENT = 1 << 18;
        /// `sharing_immutable`.
        const SHARING_IMMUTABLE = 1 << 19;
        /// `mapping_scoped`.
        const MAPPING_SCOPED = 1 << 24;
        /// `mapping_persistent`.
        const MAPPING_PERSISTENT = 1 << 25;
        /// `mapping_optional`.
        const MAPPING_OPTIONAL = 1 << 26;
        /// `mapping_access_random`.
        const MAPPING_ACCESS_RANDOM = 1 << 27;
        /// `mapping_access_sequential_write`.
        const MAPPING_ACCESS_SEQUENTIAL_WRITE = 1 << 28;
    }
}

impl BufferUsage {
    /// No bits: in a heap key this is the wildcard `*`.
    pub const NONE: BufferUsage = BufferUsage::empty();
    /// Every usage bit above.
    pub const ALL: BufferUsage = BufferUsage::all();
}

/// The flag of `F` named `name` (IREE's lowercase name; compared ignoring
/// ASCII case), if any.
pub(crate) fn flag_named<F: Flags + Copy>(name: &str) -> Option<F> {
    F::FLAGS
        .iter()
        .find(|flag| flag.name().eq_ignore_ascii_case(name))
        .map(|flag| *flag.value())
}

/// Writes `set` as lowercase IREE names joined by `|` (greedy in declaration
/// order, so composites first), `*` if empty, and any bits without a name as
/// a `0x` remainder.
fn write_names<F: Flags<Bits = u32> + Copy>(f: &mut fmt::Formatter<'_>, set: F) -> fmt::Result {
    let mut remaining = set.bits();
    if remaining == 0 {
        return f.write_str("*");
    }
    let mut separator = "";
    for flag in F::FLAGS {
        let bits = flag.value().bits();
        if bits != 0 && remaining & bits == bits {
            f.write_str(separator)?;
            for c in flag.name().chars() {
                fmt::Write::write_char(f, c.to_ascii_lowercase())?;
            }
            separator = "|";
            remaining &= !bits;
        }
    }
    if remaining != 0 {
        write!(f, "{separator}{remaining:#x}")?;
    }
    Ok(())
}

impl fmt::Display for MemoryType {
    /// Lowercase IREE names joined by `|` (composites first), `*` if empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_names(f, *self)
    }
}
impl fmt::Debug for MemoryType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MemoryType({self})")
    }
}
impl fmt::Display for BufferUsage {
    /// Lowercase IREE names joined by `|` (composites first), `*` if empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_names(f, *self)
    }
}
impl fmt::Debug for BufferUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BufferUsage({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_to_its_constant_and_displays_back() {
        for flag in MemoryType::FLAGS {
            let name = flag.name().to_ascii_lowercase();
            assert_eq!(flag_named::<MemoryType>(&name), Some(*flag.value()));
            assert_eq!(flag.value().to_string(), name);
        }
        for flag in BufferUsage::FLAGS {
            let name = flag.name().to_ascii_lowercase();
            assert_eq!(flag_named::<BufferUsage>(&name), Some(*flag.value()));
            assert_eq!(flag.value().to_string(), name);
        }
        assert_eq!(flag_named::<BufferUsage>("all"), None);
        assert_eq!(flag_named::<MemoryType>("none"), None);
    }

    #[test]
    fn unnamed_bits_display_as_a_hex_remainder() {
        assert_eq!(MemoryType::from_bits_retain(1 << 6).to_string(), "0x40");
        assert_eq!(
            MemoryType::from_bits_retain((1 << 0) | (1 << 30)).to_string(),
            "optimal|0x40000000"
        );
    }
}
