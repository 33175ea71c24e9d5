//! The virtio-blk side of the protocol (virtio 1.2, section 5.2): feature
//! bits, request types and status codes, the request header, and the
//! device configuration a backend reports, checked before it is trusted.

/// Sectors in virtio-blk are 512 bytes whatever the device's block size.
pub(crate) const SECTOR_BYTES: u64 = 512;

/// Feature bits of the device and of virtio itself.
pub(crate) mod feature {
    /// The device bounds a data segment's length (`size_max`).
    pub(crate) const SIZE_MAX: u64 = 1 << 1;
    /// The device bounds the segments per request (`seg_max`).
    pub(crate) const SEG_MAX: u64 = 1 << 2;
    /// The device is read-only.
    pub(crate) const RO: u64 = 1 << 5;
    /// The device reports its block size (`blk_size`).
    pub(crate) const BLK_SIZE: u64 = 1 << 6;
    /// The device takes `VIRTIO_BLK_T_FLUSH`.
    pub(crate) const FLUSH: u64 = 1 << 9;
    /// The device has several request queues (`num_queues`).
    pub(crate) const MQ: u64 = 1 << 12;
    /// The device takes `VIRTIO_BLK_T_DISCARD`.
    pub(crate) const DISCARD: u64 = 1 << 13;
    /// The device takes `VIRTIO_BLK_T_WRITE_ZEROES`.
    pub(crate) const WRITE_ZEROES: u64 = 1 << 14;
    /// vhost-user's own bit: the backend speaks protocol features.
    pub(crate) const PROTOCOL_FEATURES: u64 = 1 << 30;
    /// Virtio 1.x (little-endian rings and config).
    pub(crate) const VERSION_1: u64 = 1 << 32;
}

/// Request types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RequestType {
    /// Read sectors into the data buffer.
    In = 0,
    /// Write the data buffer to sectors.
    Out = 1,
    /// Make completed writes durable.
    Flush = 4,
    /// Give sectors back to the device (what they read as is its choice).
    Discard = 11,
    /// Make sectors read as zeros.
    WriteZeroes = 13,
}

impl RequestType {
    /// The name used in messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            RequestType::In => "VIRTIO_BLK_T_IN",
            RequestType::Out => "VIRTIO_BLK_T_OUT",
            RequestType::Flush => "VIRTIO_BLK_T_FLUSH",
            RequestType::Discard => "VIRTIO_BLK_T_DISCARD",
            RequestType::WriteZeroes => "VIRTIO_BLK_T_WRITE_ZEROES",
        }
    }
}

/// Status byte values a device writes last.
pub(crate) mod status {
    /// Done.
    pub(crate) const OK: u8 = 0;
    /// The device's I/O failed.
    pub(crate) const IOERR: u8 = 1;
    /// The device does not take this request.
    pub(crate) const UNSUPP: u8 = 2;
}

/// Bytes of the request header (`virtio_blk_outhdr`).
pub(crate) const HEADER_BYTES: usize = 16;

/// Bytes of one discard or write-zeroes range (`virtio_blk_discard_write_zeroes`).
pub(crate) const RANGE_BYTES: usize = 16;

/// The request header, little-endian: type, reserved priority, sector.
pub(crate) fn header(kind: RequestType, sector: u64) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[0..4].copy_from_slice(&(kind as u32).to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    h
}

/// One discard or write-zeroes range: first sector, sector count, flags
/// (none: QEMU refuses a discard with the unmap flag).
pub(crate) fn range(sector: u64, sectors: u32) -> [u8; RANGE_BYTES] {
    let mut r = [0u8; RANGE_BYTES];
    r[0..8].copy_from_slice(&sector.to_le_bytes());
    r[8..12].copy_from_slice(&sectors.to_le_bytes());
    r
}

/// Bytes of the configuration read: every field up to
/// `write_zeroes_may_unmap` (the later ones, secure erase and zoned
/// devices, are not used).
pub(crate) const CONFIG_BYTES: usize = 60;

/// The device configuration this client uses, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlkConfig {
    /// Capacity in 512-byte sectors.
    pub(crate) capacity_sectors: u64,
    /// Largest data segment (0: no bound).
    pub(crate) size_max_bytes: u32,
    /// Most data segments per request.
    pub(crate) seg_max: u32,
    /// The device's logical block size: offsets and lengths are multiples.
    pub(crate) blk_size_bytes: u32,
    /// Request queues the device has.
    pub(crate) num_queues: u16,
    /// Most sectors one discard range covers (0 when not offered).
    pub(crate) max_discard_sectors: u32,
    /// Most sectors one write-zeroes range covers (0 when not offered).
    pub(crate) max_write_zeroes_sectors: u32,
}

/// The largest block size accepted: QEMU allows up to 2 MiB.
const MAX_BLK_SIZE_BYTES: u32 = 2 << 20;

/// The most segments per request believed: the ring itself has no more
/// descriptors (a backend reporting more is wrong, not generous).
const MAX_SEG_MAX: u32 = 1 << 15;

impl BlkConfig {
    /// Parses and checks `bytes` as read with the acked `features`; the
    /// error says what is wrong with the backend's report.
    pub(crate) fn parse(bytes: &[u8], features: u64) -> Result<BlkConfig, String> {
        if bytes.len() < CONFIG_BYTES {
            return Err(format!(
                "the backend's configuration space has {} bytes, a virtio-blk one has at least {CONFIG_BYTES}",
                bytes.len()
            ));
        }
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
        let u16_at = |o: usize| u16::from_le_bytes(bytes[o..o + 2].try_into().expect("2 bytes"));
        let has = |bit: u64| features & bit != 0;
        let capacity_sectors = u64_at(0);
        if capacity_sectors == 0 {
            return Err("the backend reports a capacity of 0 sectors: give its export a file or device with data room (qemu-storage-daemon --blockdev file,filename=...)".into());
        }
        if capacity_sectors.checked_mul(SECTOR_BYTES).is_none() {
            return Err(format!(
                "the backend reports a capacity of {capacity_sectors} sectors, more bytes than 64 bits count"
            ));
        }
        let size_max_bytes = if has(feature::SIZE_MAX) { u32_at(8) } else { 0 };
        if size_max_bytes != 0 && size_max_bytes < 4096 {
            return Err(format!(
                "the backend bounds a data segment to {size_max_bytes} bytes; this client needs at least 4096"
            ));
        }
        let seg_max = if has(feature::SEG_MAX) { u32_at(12) } else { 1 };
        if seg_max == 0 || seg_max > MAX_SEG_MAX {
            return Err(format!(
                "the backend reports seg_max {seg_max}: a request takes 1 to {MAX_SEG_MAX} data segments"
            ));
        }
        let blk_size_bytes = if has(feature::BLK_SIZE) {
            u32_at(20)
        } else {
            512
        };
        if !blk_size_bytes.is_power_of_two()
            || !(SECTOR_BYTES as u32..=MAX_BLK_SIZE_BYTES).contains(&blk_size_bytes)
        {
            return Err(format!(
                "the backend reports a block size of {blk_size_bytes} bytes: a power of two from 512 to {MAX_BLK_SIZE_BYTES} is expected"
            ));
        }
        let num_queues = if has(feature::MQ) { u16_at(34) } else { 1 };
        if num_queues == 0 {
            return Err("the backend reports 0 request queues".into());
        }
        let max_discard_sectors = if has(feature::DISCARD) { u32_at(36) } else { 0 };
        let max_write_zeroes_sectors = if has(feature::WRITE_ZEROES) {
            u32_at(48)
        } else {
            0
        };
        Ok(BlkConfig {
            capacity_sectors,
            size_max_bytes,
            seg_max,
            blk_size_bytes,
            num_queues,
            max_discard_sectors,
            max_write_zeroes_sectors,
        })
    }

    /// Capacity in bytes.
    pub(crate) fn capacity_bytes(&self) -> u64 {
        self.capacity_sectors * SECTOR_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(capacity: u64, seg_max: u32, blk_size: u32, queues: u16) -> Vec<u8> {
        let mut c = vec![0u8; CONFIG_BYTES];
        c[0..8].copy_from_slice(&capacity.to_le_bytes());
        c[12..16].copy_from_slice(&seg_max.to_le_bytes());
        c[20..24].copy_from_slice(&blk_size.to_le_bytes());
        c[34..36].copy_from_slice(&queues.to_le_bytes());
        c[36..40].copy_from_slice(&32768u32.to_le_bytes());
        c
    }

    const ALL: u64 = feature::SEG_MAX | feature::BLK_SIZE | feature::MQ | feature::DISCARD;

    #[test]
    fn a_sane_configuration_is_read() {
        let c = BlkConfig::parse(&config(131072, 126, 4096, 4), ALL).unwrap();
        assert_eq!(c.capacity_bytes(), 64 << 20);
        assert_eq!((c.seg_max, c.blk_size_bytes, c.num_queues), (126, 4096, 4));
        assert_eq!(c.max_discard_sectors, 32768);
        // Fields of features not acked are not read.
        let c = BlkConfig::parse(&config(8, 0, 0, 0), 0).unwrap();
        assert_eq!((c.seg_max, c.blk_size_bytes, c.num_queues), (1, 512, 1));
    }

    #[test]
    fn absurd_configurations_are_refused_saying_what_is_wrong() {
        let e = BlkConfig::parse(&config(0, 126, 512, 1), ALL).unwrap_err();
        assert!(e.contains("capacity of 0 sectors"), "{e}");
        let e = BlkConfig::parse(&config(8, 0, 512, 1), ALL).unwrap_err();
        assert!(e.contains("seg_max 0"), "{e}");
        let e = BlkConfig::parse(&config(8, u32::MAX, 512, 1), ALL).unwrap_err();
        assert!(e.contains("seg_max 4294967295"), "{e}");
        let e = BlkConfig::parse(&config(8, 1, 1000, 1), ALL).unwrap_err();
        assert!(e.contains("block size of 1000"), "{e}");
        let e = BlkConfig::parse(&config(8, 1, 512, 0), ALL).unwrap_err();
        assert!(e.contains("0 request queues"), "{e}");
        let e = BlkConfig::parse(&config(u64::MAX, 1, 512, 1), ALL).unwrap_err();
        assert!(e.contains("64 bits"), "{e}");
        let e = BlkConfig::parse(&[0u8; 20], ALL).unwrap_err();
        assert!(e.contains("20 bytes"), "{e}");
    }

    #[test]
    fn headers_and_ranges_are_little_endian() {
        let h = header(RequestType::Out, 0x0102_0304_0506_0708);
        assert_eq!(h[0..4], [1, 0, 0, 0]);
        assert_eq!(h[8..16], [8, 7, 6, 5, 4, 3, 2, 1]);
        let r = range(16, 8);
        assert_eq!(r[0..8], [16, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(r[8..12], [8, 0, 0, 0]);
        assert_eq!(r[12..16], [0; 4]);
    }
}
