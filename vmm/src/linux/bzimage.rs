//! A bzImage: its setup header and the compressed kernel (the payload)
//! inside it. hugevmm boots the decompressed kernel directly, so the
//! bzImage's real-mode setup and decompressor are never run.

use super::setup_header::{SetupHeader, SetupHeaderError};

/// Why a bzImage cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BzImageError {
    /// The setup header is missing or unsuitable.
    #[error(transparent)]
    Header(#[from] SetupHeaderError),
    /// `payload_offset`/`payload_length` point outside the file.
    #[error(
        "the compressed kernel ({payload_length_bytes} bytes at file offset {payload_start:#x}) lies outside \
         the {image_bytes}-byte image: the file is truncated or not a bzImage"
    )]
    PayloadOutside {
        /// File offset of the payload.
        payload_start: u64,
        /// Its length.
        payload_length_bytes: u32,
        /// The image size.
        image_bytes: usize,
    },
}

/// A parsed bzImage, borrowing the image bytes.
#[derive(Debug)]
pub struct BzImage<'a> {
    /// The setup header, checked bootable.
    pub header: SetupHeader,
    /// The compressed kernel, as the decompressor would see it.
    pub payload: &'a [u8],
}

/// Parses a bzImage and locates its payload.
pub fn parse(image: &[u8]) -> Result<BzImage<'_>, BzImageError> {
    let header = SetupHeader::parse(image)?;
    header.check_bootable()?;
    // The protected-mode part follows the boot sector and the setup sectors;
    // payload_offset counts from there.
    let protected_mode_start = (u64::from(header.setup_sects()) + 1) * 512;
    let payload_start = protected_mode_start + u64::from(header.payload_offset());
    let payload_length_bytes = header.payload_length_bytes();
    let end = payload_start + u64::from(payload_length_bytes);
    if payload_length_bytes == 0 || end > image.len() as u64 {
        return Err(BzImageError::PayloadOutside {
            payload_start,
            payload_length_bytes,
            image_bytes: image.len(),
        });
    }
    Ok(BzImage {
        header,
        payload: &image[payload_start as usize..end as usize],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::le;
    use crate::linux::setup_header::field;
    use crate::linux::setup_header::tests::header_page;
    use crate::linux::setup_header::LOADED_HIGH;

    #[test]
    fn finds_the_payload_after_the_setup_sectors() {
        let mut image = header_page(0x020f, LOADED_HIGH, 1);
        image.resize(0x1000 + 0x40, 0);
        // setup_sects = 3: protected mode code at 0x800.
        le::put(&mut image, field::PAYLOAD_OFFSET, &0x800_u32.to_le_bytes());
        le::put(&mut image, field::PAYLOAD_LENGTH, &0x10_u32.to_le_bytes());
        image[0x1000..0x1010].copy_from_slice(&[0xab; 16]);
        let bz = parse(&image).unwrap();
        assert_eq!(bz.payload, &[0xab; 16]);

        le::put(&mut image, field::PAYLOAD_LENGTH, &0x41_u32.to_le_bytes());
        assert!(matches!(
            parse(&image),
            Err(BzImageError::PayloadOutside { .. })
        ));
    }

    #[test]
    fn header_problems_come_through() {
        let image = header_page(0x020f, LOADED_HIGH, 0);
        let err = parse(&image).unwrap_err();
        assert!(err.to_string().contains("XLF_KERNEL_64"), "{err}");
    }
}
