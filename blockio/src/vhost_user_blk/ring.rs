//! The driver side of one split virtqueue (virtio 1.2, section 2.7) in
//! shared memory: the descriptor table, the available ring this side
//! writes, and the used ring the backend writes.
//!
//! Hand-written because `virtio-queue` implements the device side only
//! (popping chains, adding used elements); its driver-side helpers exist
//! for its own tests. This side is small: chain descriptors from a free
//! list, publish heads, and take used elements back. No event index and
//! no indirect descriptors are negotiated, so the rules are the base ones:
//! publish a head with a release store of `avail.idx`, read `used.idx`
//! with an acquire load before the elements it covers.

use std::sync::atomic::{fence, AtomicU16, Ordering};

/// `VRING_DESC_F_NEXT`: the chain goes on at `next`.
const DESC_F_NEXT: u16 = 1;
/// `VRING_DESC_F_WRITE`: the device writes this buffer.
const DESC_F_WRITE: u16 = 2;

/// Bytes of one descriptor.
const DESC_BYTES: usize = 16;
/// Bytes of one used element.
const USED_ELEM_BYTES: usize = 8;

/// Where the three parts of a ring of `size` entries lie from its start,
/// and its whole length (each part aligned as the spec requires: 16, 2, 4;
/// the used ring on its own 4 KiB page, away from what this side writes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RingLayout {
    /// Entries (a power of two).
    pub(crate) size: u16,
    /// Offset of the descriptor table.
    pub(crate) desc: usize,
    /// Offset of the available ring.
    pub(crate) avail: usize,
    /// Offset of the used ring.
    pub(crate) used: usize,
    /// Bytes of the whole ring, a multiple of 4 KiB.
    pub(crate) len_bytes: usize,
}

fn round_up(value: usize, to: usize) -> usize {
    value.div_ceil(to) * to
}

impl RingLayout {
    /// The layout of a ring of `size` entries.
    ///
    /// # Panics
    ///
    /// If `size` is not a power of two.
    pub(crate) fn new(size: u16) -> RingLayout {
        assert!(size.is_power_of_two(), "a ring size is a power of two");
        let n = usize::from(size);
        let desc = 0;
        let avail = desc + n * DESC_BYTES;
        let used = round_up(avail + 6 + 2 * n, 4096);
        let len_bytes = round_up(used + 6 + USED_ELEM_BYTES * n, 4096);
        RingLayout {
            size,
            desc,
            avail,
            used,
            len_bytes,
        }
    }
}

/// One buffer of a chain: its address in the shared area (the backend's
/// "guest physical" address), its length, and who writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    /// Address in the backend's view of the shared memory.
    pub(crate) addr: u64,
    /// Bytes.
    pub(crate) len_bytes: u32,
    /// The device writes it (a read's data, a status byte).
    pub(crate) device_writes: bool,
}

/// A completed chain: its head and the bytes the device wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Used {
    /// The head descriptor the chain was published under.
    pub(crate) head: u16,
    /// Bytes the device says it wrote into the chain.
    pub(crate) written_bytes: u32,
}

/// The driver side of one split ring.
pub(crate) struct DriverRing {
    base: *mut u8,
    layout: RingLayout,
    free: Vec<u16>,
    /// Heads of published chains not yet used: a backend that returns
    /// another is caught before a descriptor is freed twice.
    in_flight: Vec<bool>,
    /// This side's copy of `avail.idx`.
    next_avail: u16,
    /// The next used element to take.
    next_used: u16,
}

// SAFETY: the ring memory is shared memory owned by the client; a
// DriverRing is used under the client's state lock only.
unsafe impl Send for DriverRing {}

impl DriverRing {
    /// A ring over `layout.len_bytes` at `base`, zeroed: no chain
    /// published, none used.
    ///
    /// # Safety
    ///
    /// `base..base + layout.len_bytes` must be writable memory, 4 KiB
    /// aligned, that outlives the ring and that nothing else in this
    /// process accesses while it lives.
    pub(crate) unsafe fn new(base: *mut u8, layout: RingLayout) -> DriverRing {
        // SAFETY: the caller gives us this memory.
        unsafe { std::ptr::write_bytes(base, 0, layout.len_bytes) };
        DriverRing {
            base,
            layout,
            free: (0..layout.size).rev().collect(),
            in_flight: vec![false; usize::from(layout.size)],
            next_avail: 0,
            next_used: 0,
        }
    }

    /// Descriptors not in a published chain.
    pub(crate) fn free_descriptors(&self) -> usize {
        self.free.len()
    }

    /// The head the next [`Self::publish`] will use, if a descriptor is
    /// free: per-request memory can be laid out by head before it.
    pub(crate) fn peek_head(&self) -> Option<u16> {
        self.free.last().copied()
    }

    fn desc_ptr(&self, index: u16) -> *mut u8 {
        self.base
            .wrapping_add(self.layout.desc + usize::from(index) * DESC_BYTES)
    }

    fn avail_idx(&self) -> &AtomicU16 {
        // SAFETY: 2-aligned (the avail ring is), inside the ring memory,
        // which lives as long as self; the backend only reads it.
        unsafe {
            &*self
                .base
                .wrapping_add(self.layout.avail + 2)
                .cast::<AtomicU16>()
        }
    }

    fn used_idx(&self) -> &AtomicU16 {
        // SAFETY: as above; the used ring is 4-aligned, the backend writes
        // it atomically as the spec requires.
        unsafe {
            &*self
                .base
                .wrapping_add(self.layout.used + 2)
                .cast::<AtomicU16>()
        }
    }

    /// Writes `segments` as one chain and publishes its head; `None`, with
    /// nothing written, when too few descriptors are free. Kick the
    /// backend afterwards (once for several chains).
    ///
    /// # Panics
    ///
    /// If `segments` is empty.
    pub(crate) fn publish(&mut self, segments: &[Segment]) -> Option<u16> {
        assert!(!segments.is_empty(), "a chain has a segment");
        if segments.len() > self.free.len() {
            return None;
        }
        let ids: Vec<u16> = (0..segments.len())
            .map(|_| self.free.pop().expect("counted above"))
            .collect();
        for (k, segment) in segments.iter().enumerate() {
            let mut flags = if segment.device_writes {
                DESC_F_WRITE
            } else {
                0
            };
            let next = ids.get(k + 1).copied().unwrap_or(0);
            if k + 1 < segments.len() {
                flags |= DESC_F_NEXT;
            }
            let mut entry = [0u8; DESC_BYTES];
            entry[0..8].copy_from_slice(&segment.addr.to_le_bytes());
            entry[8..12].copy_from_slice(&segment.len_bytes.to_le_bytes());
            entry[12..14].copy_from_slice(&flags.to_le_bytes());
            entry[14..16].copy_from_slice(&next.to_le_bytes());
            // SAFETY: a descriptor of ours, not in a published chain (it
            // came from the free list), inside the ring memory.
            unsafe {
                std::ptr::copy_nonoverlapping(entry.as_ptr(), self.desc_ptr(ids[k]), DESC_BYTES)
            };
        }
        let head = ids[0];
        self.in_flight[usize::from(head)] = true;
        let slot = usize::from(self.next_avail % self.layout.size);
        let ring_entry = self.base.wrapping_add(self.layout.avail + 4 + 2 * slot);
        // SAFETY: an available-ring entry the backend does not read until
        // avail.idx covers it, which the release store below publishes.
        unsafe { ring_entry.cast::<u16>().write_unaligned(head.to_le()) };
        self.next_avail = self.next_avail.wrapping_add(1);
        self.avail_idx()
            .store(self.next_avail.to_le(), Ordering::Release);
        Some(head)
    }

    /// Takes the next used element, if the backend has published one, and
    /// frees its chain's descriptors. An element that names no chain in
    /// flight is the backend breaking the protocol: the error says how,
    /// and the ring is not to be used any more.
    pub(crate) fn take_used(&mut self) -> Result<Option<Used>, String> {
        let published = u16::from_le(self.used_idx().load(Ordering::Acquire));
        if published == self.next_used {
            return Ok(None);
        }
        if published.wrapping_sub(self.next_used) > self.layout.size {
            return Err(format!(
                "the backend moved the used index from {} to {published}, past the ring's {} entries",
                self.next_used, self.layout.size
            ));
        }
        let slot = usize::from(self.next_used % self.layout.size);
        let elem = self
            .base
            .wrapping_add(self.layout.used + 4 + USED_ELEM_BYTES * slot);
        let mut bytes = [0u8; USED_ELEM_BYTES];
        // SAFETY: an element the backend published before used.idx (the
        // acquire load above orders this read after it).
        unsafe { std::ptr::copy_nonoverlapping(elem, bytes.as_mut_ptr(), USED_ELEM_BYTES) };
        self.next_used = self.next_used.wrapping_add(1);
        let id = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
        let written_bytes = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
        let head = u16::try_from(id)
            .ok()
            .filter(|&h| h < self.layout.size && self.in_flight[usize::from(h)])
            .ok_or_else(|| format!("the backend returned chain {id}, which is not in flight"))?;
        self.in_flight[usize::from(head)] = false;
        self.free_chain(head)?;
        Ok(Some(Used {
            head,
            written_bytes,
        }))
    }

    /// Puts a used chain's descriptors back on the free list.
    fn free_chain(&mut self, head: u16) -> Result<(), String> {
        let mut index = head;
        for _ in 0..self.layout.size {
            let mut entry = [0u8; DESC_BYTES];
            // SAFETY: a descriptor of a chain the backend returned: it no
            // longer reads it.
            unsafe {
                std::ptr::copy_nonoverlapping(self.desc_ptr(index), entry.as_mut_ptr(), DESC_BYTES)
            };
            self.free.push(index);
            let flags = u16::from_le_bytes([entry[12], entry[13]]);
            if flags & DESC_F_NEXT == 0 {
                return Ok(());
            }
            index = u16::from_le_bytes([entry[14], entry[15]]);
        }
        Err(format!(
            "chain {head} loops: the descriptor table was overwritten"
        ))
    }

    /// Makes the ring's stores visible before a kick is written (the
    /// eventfd write is a syscall, a full barrier on x86; this says so
    /// for other architectures).
    pub(crate) fn before_kick(&self) {
        fence(Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device's side, for the test: pops available heads and returns
    /// them used.
    struct Device {
        base: *mut u8,
        layout: RingLayout,
        next_avail: u16,
        next_used: u16,
    }

    impl Device {
        fn pop(&mut self) -> Option<Vec<(u64, u32, u16)>> {
            // SAFETY: the test's own ring memory.
            let idx = unsafe { self.base.add(self.layout.avail + 2).cast::<u16>().read() };
            if idx == self.next_avail {
                return None;
            }
            let slot = usize::from(self.next_avail % self.layout.size);
            // SAFETY: as above.
            let mut head = unsafe {
                self.base
                    .add(self.layout.avail + 4 + 2 * slot)
                    .cast::<u16>()
                    .read()
            };
            self.next_avail += 1;
            let first = head;
            let mut chain = Vec::new();
            loop {
                // SAFETY: as above.
                let d = unsafe {
                    std::slice::from_raw_parts(self.base.add(usize::from(head) * 16), 16)
                };
                let flags = u16::from_le_bytes([d[12], d[13]]);
                chain.push((
                    u64::from_le_bytes(d[0..8].try_into().unwrap()),
                    u32::from_le_bytes(d[8..12].try_into().unwrap()),
                    flags & DESC_F_WRITE,
                ));
                if flags & DESC_F_NEXT == 0 {
                    break;
                }
                head = u16::from_le_bytes([d[14], d[15]]);
            }
            let slot = usize::from(self.next_used % self.layout.size);
            // SAFETY: as above.
            unsafe {
                let e = self.base.add(self.layout.used + 4 + 8 * slot);
                e.cast::<u32>().write_unaligned(u32::from(first));
                e.add(4).cast::<u32>().write_unaligned(1);
                self.next_used += 1;
                self.base
                    .add(self.layout.used + 2)
                    .cast::<u16>()
                    .write(self.next_used);
            }
            Some(chain)
        }
    }

    #[test]
    fn chains_go_out_and_come_back_with_their_descriptors_freed() {
        let layout = RingLayout::new(4);
        assert_eq!(layout.len_bytes % 4096, 0);
        let mut memory = vec![0u64; layout.len_bytes / 8];
        let base = memory.as_mut_ptr().cast::<u8>();
        // SAFETY: the vector outlives the ring and nothing else touches it.
        let mut ring = unsafe { DriverRing::new(base, layout) };
        let mut device = Device {
            base,
            layout,
            next_avail: 0,
            next_used: 0,
        };
        let seg = |addr, device_writes| Segment {
            addr,
            len_bytes: 16,
            device_writes,
        };
        // Wraps the 16-bit indices' ring positions many times over.
        for round in 0..40u64 {
            let head = ring
                .publish(&[seg(round, false), seg(100 + round, true), seg(200, true)])
                .expect("room for a 3-chain");
            assert!(
                ring.publish(&[seg(1, false), seg(2, true)]).is_none(),
                "1 left"
            );
            assert_eq!(ring.free_descriptors(), 1);
            assert_eq!(ring.take_used(), Ok(None));
            let chain = device.pop().expect("published");
            assert_eq!(
                chain,
                vec![(round, 16, 0), (100 + round, 16, 2), (200, 16, 2)]
            );
            assert_eq!(
                ring.take_used(),
                Ok(Some(Used {
                    head,
                    written_bytes: 1
                }))
            );
            assert_eq!(ring.free_descriptors(), 4);
        }
        // A backend that returns the same chain again is caught, and no
        // descriptor is freed twice.
        let head = ring.publish(&[seg(1, false)]).unwrap();
        device.pop().unwrap();
        assert!(ring.take_used().unwrap().is_some());
        // SAFETY: the test's own ring memory.
        unsafe {
            let e = base.add(layout.used + 4 + 8 * usize::from(device.next_used % 4));
            e.cast::<u32>().write_unaligned(u32::from(head));
            device.next_used += 1;
            base.add(layout.used + 2)
                .cast::<u16>()
                .write(device.next_used);
        }
        let err = ring.take_used().unwrap_err();
        assert!(err.contains("not in flight"), "{err}");
        assert_eq!(ring.free_descriptors(), 4);
    }
}
