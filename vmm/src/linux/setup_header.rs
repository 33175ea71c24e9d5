//! The x86 boot protocol's setup header (`struct setup_header`, at offset
//! 0x1f1 of both a bzImage and the zero page): reading one from a kernel
//! image, checking that hugevmm can boot it, and making one for a kernel
//! that comes without (a bare vmlinux).

use super::le;

/// Where the setup header starts, in a bzImage and in the zero page.
pub const HEADER_OFFSET: usize = 0x1f1;

/// Field offsets from the start of the image / zero page
/// (Documentation/arch/x86/boot.rst).
pub mod field {
    /// `setup_sects`: size of the real-mode setup in 512-byte sectors.
    pub const SETUP_SECTS: usize = 0x1f1;
    /// `boot_flag`: 0xAA55.
    pub const BOOT_FLAG: usize = 0x1fe;
    /// `jump`: its second byte gives the end of the header.
    pub const JUMP: usize = 0x200;
    /// `header`: the magic "HdrS".
    pub const HEADER: usize = 0x202;
    /// `version`: the boot protocol version.
    pub const VERSION: usize = 0x206;
    /// `vid_mode`.
    pub const VID_MODE: usize = 0x1fa;
    /// `type_of_loader`.
    pub const TYPE_OF_LOADER: usize = 0x210;
    /// `loadflags`.
    pub const LOADFLAGS: usize = 0x211;
    /// `ramdisk_image`: initrd address (low 32 bits).
    pub const RAMDISK_IMAGE: usize = 0x218;
    /// `ramdisk_size`: initrd size (low 32 bits).
    pub const RAMDISK_SIZE: usize = 0x21c;
    /// `cmd_line_ptr`: command line address (low 32 bits).
    pub const CMD_LINE_PTR: usize = 0x228;
    /// `initrd_addr_max`: highest address the initrd may occupy.
    pub const INITRD_ADDR_MAX: usize = 0x22c;
    /// `kernel_alignment`.
    pub const KERNEL_ALIGNMENT: usize = 0x230;
    /// `relocatable_kernel`.
    #[cfg(test)]
    pub const RELOCATABLE_KERNEL: usize = 0x234;
    /// `xloadflags`.
    pub const XLOADFLAGS: usize = 0x236;
    /// `cmdline_size`: longest command line, without its NUL.
    pub const CMDLINE_SIZE: usize = 0x238;
    /// `payload_offset`: compressed kernel, from the protected-mode code.
    pub const PAYLOAD_OFFSET: usize = 0x248;
    /// `payload_length`.
    pub const PAYLOAD_LENGTH: usize = 0x24c;
    /// `pref_address`: where a non-relocated kernel wants to be loaded.
    #[cfg(test)]
    pub const PREF_ADDRESS: usize = 0x258;
    /// `init_size`: memory the kernel needs from its load address on.
    pub const INIT_SIZE: usize = 0x260;
}

/// `loadflags` bit: the protected-mode code is loaded at 1 MiB or above.
pub const LOADED_HIGH: u8 = 0x01;
/// `loadflags` bit: `heap_end_ptr` is valid.
pub const CAN_USE_HEAP: u8 = 0x80;
/// `xloadflags` bit: the kernel has the 64-bit entry point.
pub const XLF_KERNEL_64: u16 = 0x01;
/// The magic in `header`.
pub const HDRS_MAGIC: &[u8; 4] = b"HdrS";
/// The magic in `boot_flag`.
pub const BOOT_FLAG_MAGIC: u16 = 0xaa55;
/// `type_of_loader` for a boot loader without an assigned ID.
pub const LOADER_TYPE_UNDEFINED: u8 = 0xff;

/// Protocol 2.08 is the first with `payload_offset`/`payload_length`, which
/// is how the compressed kernel is found.
pub const MIN_VERSION: u16 = 0x0208;
const VERSION_INIT_SIZE: u16 = 0x020a;
const VERSION_XLOADFLAGS: u16 = 0x020c;
const VERSION_CMDLINE_SIZE: u16 = 0x0206;
/// The version a synthesized header claims: 2.15, the current protocol.
pub const SYNTHESIZED_VERSION: u16 = 0x020f;
/// End of a 2.15 header (`kernel_info_offset` is its last field).
const SYNTHESIZED_END: usize = 0x26c;
/// Before protocol 2.06 the command line was limited to 255 bytes.
const LEGACY_CMDLINE_SIZE: u32 = 255;
/// Before protocol 2.10 a kernel was loaded at 1 MiB.
#[cfg(test)]
const LEGACY_PREF_ADDRESS: u64 = 0x10_0000;

/// Why a setup header is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SetupHeaderError {
    /// The image is shorter than a setup header.
    #[error("the image is {len_bytes} bytes, too short for an x86 boot setup header (needs at least {needed_bytes})")]
    TooShort {
        /// Image size.
        len_bytes: usize,
        /// Bytes needed.
        needed_bytes: usize,
    },
    /// No "HdrS" / 0xAA55 magic: not a bzImage.
    #[error("no x86 boot setup header (boot_flag {boot_flag:#06x}, header {header:02x?}): this is not a bzImage")]
    NoMagic {
        /// The `boot_flag` found.
        boot_flag: u16,
        /// The `header` bytes found.
        header: [u8; 4],
    },
    /// The boot protocol is older than 2.08.
    #[error("boot protocol {}.{:02} is too old: hugevmm needs 2.08 or later (Linux 2.6.26+)", version >> 8, version & 0xff)]
    TooOld {
        /// The version found.
        version: u16,
    },
    /// `loadflags` lacks LOADED_HIGH: a zImage.
    #[error("the kernel is not loaded high (loadflags {loadflags:#04x} lacks LOADED_HIGH): a zImage cannot be booted, build a bzImage")]
    NotLoadedHigh {
        /// The flags found.
        loadflags: u8,
    },
    /// `xloadflags` lacks XLF_KERNEL_64: a 32-bit kernel.
    #[error("the kernel has no 64-bit entry point (xloadflags {xloadflags:#06x} lacks XLF_KERNEL_64): boot an x86-64 kernel")]
    Not64Bit {
        /// The flags found.
        xloadflags: u16,
    },
}

/// A setup header: the raw bytes from offset 0x1f1 to the header's end,
/// which is what the zero page carries, plus typed access to its fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupHeader {
    raw: Vec<u8>,
}

impl SetupHeader {
    /// Reads the header of a kernel image and checks its magic and version.
    pub fn parse(image: &[u8]) -> Result<SetupHeader, SetupHeaderError> {
        let min_end = field::VERSION + 2;
        if image.len() < min_end {
            return Err(SetupHeaderError::TooShort {
                len_bytes: image.len(),
                needed_bytes: min_end,
            });
        }
        let boot_flag = le::u16_at(image, field::BOOT_FLAG).unwrap_or(0);
        let header = le::bytes::<4>(image, field::HEADER).unwrap_or_default();
        if boot_flag != BOOT_FLAG_MAGIC || &header != HDRS_MAGIC {
            return Err(SetupHeaderError::NoMagic { boot_flag, header });
        }
        let version = le::u16_at(image, field::VERSION).unwrap_or(0);
        if version < MIN_VERSION {
            return Err(SetupHeaderError::TooOld { version });
        }
        // The header's own length: 0x202 plus the jump's displacement byte.
        let end = field::HEADER + usize::from(image[field::JUMP + 1]);
        let needed = end.max(field::PAYLOAD_LENGTH + 4);
        if image.len() < needed {
            return Err(SetupHeaderError::TooShort {
                len_bytes: image.len(),
                needed_bytes: needed,
            });
        }
        Ok(SetupHeader {
            raw: image[HEADER_OFFSET..needed].to_vec(),
        })
    }

    /// A header for a kernel that has none (a bare vmlinux ELF): the fields
    /// a 2.15 boot loader would find in a modern bzImage.
    pub fn synthesize(
        kernel_alignment: u32,
        cmdline_size: u32,
        initrd_addr_max: u32,
    ) -> SetupHeader {
        let mut page = vec![0u8; SYNTHESIZED_END];
        le::put(&mut page, field::BOOT_FLAG, &BOOT_FLAG_MAGIC.to_le_bytes());
        // A short jmp whose displacement is the header's length, as in a
        // real image: the zero page reader computes the end from it.
        page[field::JUMP] = 0xeb;
        page[field::JUMP + 1] = (SYNTHESIZED_END - field::HEADER) as u8;
        le::put(&mut page, field::HEADER, HDRS_MAGIC);
        le::put(
            &mut page,
            field::VERSION,
            &SYNTHESIZED_VERSION.to_le_bytes(),
        );
        // "normal" video mode: no mode switch was requested.
        le::put(&mut page, field::VID_MODE, &0xffff_u16.to_le_bytes());
        page[field::TYPE_OF_LOADER] = LOADER_TYPE_UNDEFINED;
        page[field::LOADFLAGS] = LOADED_HIGH | CAN_USE_HEAP;
        le::put(
            &mut page,
            field::INITRD_ADDR_MAX,
            &initrd_addr_max.to_le_bytes(),
        );
        le::put(
            &mut page,
            field::KERNEL_ALIGNMENT,
            &kernel_alignment.to_le_bytes(),
        );
        le::put(&mut page, field::XLOADFLAGS, &XLF_KERNEL_64.to_le_bytes());
        le::put(&mut page, field::CMDLINE_SIZE, &cmdline_size.to_le_bytes());
        SetupHeader {
            raw: page[HEADER_OFFSET..].to_vec(),
        }
    }

    /// Checks what a 64-bit boot of the decompressed kernel needs.
    pub fn check_bootable(&self) -> Result<(), SetupHeaderError> {
        let loadflags = self.loadflags();
        if loadflags & LOADED_HIGH == 0 {
            return Err(SetupHeaderError::NotLoadedHigh { loadflags });
        }
        // Older headers cannot say; the vmlinux ELF's class is checked later.
        if self.version() >= VERSION_XLOADFLAGS && self.xloadflags() & XLF_KERNEL_64 == 0 {
            return Err(SetupHeaderError::Not64Bit {
                xloadflags: self.xloadflags(),
            });
        }
        Ok(())
    }

    /// The header bytes, from offset 0x1f1 of the image to the header's end.
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    fn u8_field(&self, offset: usize) -> Option<u8> {
        self.raw.get(offset - HEADER_OFFSET).copied()
    }

    fn u16_field(&self, offset: usize) -> Option<u16> {
        le::u16_at(&self.raw, offset - HEADER_OFFSET)
    }

    fn u32_field(&self, offset: usize) -> Option<u32> {
        le::u32_at(&self.raw, offset - HEADER_OFFSET)
    }

    #[cfg(test)]
    fn u64_field(&self, offset: usize) -> Option<u64> {
        le::u64_at(&self.raw, offset - HEADER_OFFSET)
    }

    /// Boot protocol version, e.g. 0x020f for 2.15.
    pub fn version(&self) -> u16 {
        self.u16_field(field::VERSION).unwrap_or(0)
    }

    /// Size of the real-mode setup in 512-byte sectors (0 means 4).
    pub fn setup_sects(&self) -> u8 {
        match self.u8_field(field::SETUP_SECTS).unwrap_or(0) {
            0 => 4,
            n => n,
        }
    }

    /// `loadflags`.
    pub fn loadflags(&self) -> u8 {
        self.u8_field(field::LOADFLAGS).unwrap_or(0)
    }

    /// `xloadflags` (0 before protocol 2.12).
    pub fn xloadflags(&self) -> u16 {
        if self.version() < VERSION_XLOADFLAGS {
            return 0;
        }
        self.u16_field(field::XLOADFLAGS).unwrap_or(0)
    }

    /// Offset of the compressed payload from the protected-mode code.
    pub fn payload_offset(&self) -> u32 {
        self.u32_field(field::PAYLOAD_OFFSET).unwrap_or(0)
    }

    /// Length of the compressed payload.
    pub fn payload_length_bytes(&self) -> u32 {
        self.u32_field(field::PAYLOAD_LENGTH).unwrap_or(0)
    }

    /// Memory the kernel needs from its load address (0 before 2.10).
    pub fn init_size_bytes(&self) -> u32 {
        if self.version() < VERSION_INIT_SIZE {
            return 0;
        }
        self.u32_field(field::INIT_SIZE).unwrap_or(0)
    }

    /// `kernel_alignment`.
    #[cfg(test)]
    pub fn kernel_alignment_bytes(&self) -> u32 {
        self.u32_field(field::KERNEL_ALIGNMENT).unwrap_or(0)
    }

    /// Whether the kernel may be loaded at another address than preferred.
    #[cfg(test)]
    pub fn relocatable(&self) -> bool {
        self.u8_field(field::RELOCATABLE_KERNEL).unwrap_or(0) != 0
    }

    /// Preferred load address (1 MiB before 2.10).
    #[cfg(test)]
    pub fn pref_address(&self) -> u64 {
        if self.version() < VERSION_INIT_SIZE {
            return LEGACY_PREF_ADDRESS;
        }
        self.u64_field(field::PREF_ADDRESS)
            .unwrap_or(LEGACY_PREF_ADDRESS)
    }

    /// Longest command line the kernel accepts, without the NUL.
    pub fn cmdline_size_bytes(&self) -> u32 {
        if self.version() < VERSION_CMDLINE_SIZE {
            return LEGACY_CMDLINE_SIZE;
        }
        self.u32_field(field::CMDLINE_SIZE)
            .unwrap_or(LEGACY_CMDLINE_SIZE)
    }

    /// Highest address the initrd's last byte may have.
    pub fn initrd_addr_max(&self) -> u32 {
        self.u32_field(field::INITRD_ADDR_MAX).unwrap_or(0)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A bzImage-like header page: 2.15, 64-bit, with the given fields.
    pub(crate) fn header_page(version: u16, loadflags: u8, xloadflags: u16) -> Vec<u8> {
        let mut image = vec![0u8; 0x1000];
        le::put(&mut image, field::BOOT_FLAG, &BOOT_FLAG_MAGIC.to_le_bytes());
        image[field::JUMP] = 0xeb;
        image[field::JUMP + 1] = 0x6a;
        le::put(&mut image, field::HEADER, HDRS_MAGIC);
        le::put(&mut image, field::VERSION, &version.to_le_bytes());
        image[field::SETUP_SECTS] = 3;
        image[field::LOADFLAGS] = loadflags;
        le::put(&mut image, field::XLOADFLAGS, &xloadflags.to_le_bytes());
        le::put(&mut image, field::CMDLINE_SIZE, &2047_u32.to_le_bytes());
        le::put(
            &mut image,
            field::INITRD_ADDR_MAX,
            &0x7fff_ffff_u32.to_le_bytes(),
        );
        le::put(
            &mut image,
            field::KERNEL_ALIGNMENT,
            &0x20_0000_u32.to_le_bytes(),
        );
        image[field::RELOCATABLE_KERNEL] = 1;
        le::put(
            &mut image,
            field::PREF_ADDRESS,
            &0x100_0000_u64.to_le_bytes(),
        );
        le::put(&mut image, field::INIT_SIZE, &0x300_0000_u32.to_le_bytes());
        image
    }

    #[test]
    fn reads_a_modern_header() {
        let header = SetupHeader::parse(&header_page(0x020f, LOADED_HIGH, 0x7f)).unwrap();
        header.check_bootable().unwrap();
        assert_eq!(header.version(), 0x020f);
        assert_eq!(header.raw().len(), 0x26c - 0x1f1);
        assert_eq!(header.setup_sects(), 3);
        assert_eq!(header.cmdline_size_bytes(), 2047);
        assert_eq!(header.initrd_addr_max(), 0x7fff_ffff);
        assert_eq!(header.kernel_alignment_bytes(), 0x20_0000);
        assert!(header.relocatable());
        assert_eq!(header.pref_address(), 0x100_0000);
        assert_eq!(header.init_size_bytes(), 0x300_0000);
    }

    #[test]
    fn rejects_what_cannot_boot() {
        let mut no_magic = header_page(0x020f, LOADED_HIGH, 1);
        no_magic[field::HEADER] = b'X';
        assert!(matches!(
            SetupHeader::parse(&no_magic),
            Err(SetupHeaderError::NoMagic { .. })
        ));
        let old = SetupHeader::parse(&header_page(0x0207, LOADED_HIGH, 1)).unwrap_err();
        assert_eq!(old, SetupHeaderError::TooOld { version: 0x0207 });
        assert!(old.to_string().contains("2.07"), "{old}");
        let zimage = SetupHeader::parse(&header_page(0x020f, 0, 1)).unwrap();
        assert_eq!(
            zimage.check_bootable(),
            Err(SetupHeaderError::NotLoadedHigh { loadflags: 0 })
        );
        let i386 = SetupHeader::parse(&header_page(0x020f, LOADED_HIGH, 0)).unwrap();
        assert_eq!(
            i386.check_bootable(),
            Err(SetupHeaderError::Not64Bit { xloadflags: 0 })
        );
        assert!(matches!(
            SetupHeader::parse(&header_page(0x020f, 1, 1)[..0x240]),
            Err(SetupHeaderError::TooShort { .. })
        ));
    }

    #[test]
    fn fields_newer_than_the_version_take_their_defaults() {
        let header = SetupHeader::parse(&header_page(0x0208, LOADED_HIGH, 0)).unwrap();
        header
            .check_bootable()
            .expect("2.08 cannot state 64-bit support, so it is not refused");
        assert_eq!(header.init_size_bytes(), 0);
        assert_eq!(header.pref_address(), 0x10_0000);
        assert_eq!(header.xloadflags(), 0);
    }

    #[test]
    fn synthesized_header_reads_back() {
        let header = SetupHeader::synthesize(0x20_0000, 2047, 0x7fff_ffff);
        let mut page = vec![0u8; HEADER_OFFSET];
        page.extend_from_slice(header.raw());
        let parsed = SetupHeader::parse(&page).unwrap();
        assert_eq!(parsed, header);
        parsed.check_bootable().unwrap();
        assert_eq!(parsed.version(), 0x020f);
        assert_eq!(parsed.loadflags(), LOADED_HIGH | CAN_USE_HEAP);
        assert_eq!(page[field::TYPE_OF_LOADER], 0xff);
        assert_eq!(parsed.cmdline_size_bytes(), 2047);
        assert_eq!(parsed.kernel_alignment_bytes(), 0x20_0000);
    }
}
