//! Little-endian field access in byte images (bzImage headers, ELF headers,
//! the zero page), bounds-checked by returning `None`.

/// Reads `N` bytes at `offset`.
pub fn bytes<const N: usize>(data: &[u8], offset: usize) -> Option<[u8; N]> {
    data.get(offset..offset.checked_add(N)?)?.try_into().ok()
}

/// Reads a `u16` at `offset`.
pub fn u16_at(data: &[u8], offset: usize) -> Option<u16> {
    bytes(data, offset).map(u16::from_le_bytes)
}

/// Reads a `u32` at `offset`.
pub fn u32_at(data: &[u8], offset: usize) -> Option<u32> {
    bytes(data, offset).map(u32::from_le_bytes)
}

/// Reads a `u64` at `offset`.
pub fn u64_at(data: &[u8], offset: usize) -> Option<u64> {
    bytes(data, offset).map(u64::from_le_bytes)
}

/// Writes `value` at `offset`; the caller sized `data` to hold it.
///
/// # Panics
///
/// If the field does not fit: the offsets written are fixed by the boot
/// protocol and the buffers are fixed-size, so this is a bug.
pub fn put(data: &mut [u8], offset: usize, value: &[u8]) {
    data[offset..offset + value.len()].copy_from_slice(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_and_checks_bounds() {
        let data = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(u16_at(&data, 0), Some(0x0201));
        assert_eq!(u32_at(&data, 1), Some(0x0504_0302));
        assert_eq!(u64_at(&data, 1), Some(0x0908_0706_0504_0302));
        assert_eq!(u64_at(&data, 2), None);
        assert_eq!(u16_at(&data, usize::MAX), None);
        let mut out = [0u8; 4];
        put(&mut out, 1, &0xabcd_u16.to_le_bytes());
        assert_eq!(out, [0, 0xcd, 0xab, 0]);
    }
}
