//! Checking a descriptor chain before touching what it points to.
//!
//! virtio-queue's chain iterator already stops at a chain longer than the
//! queue (so a loop ends), at a descriptor index past the table, at an
//! unreadable or nested indirect table, and at a chain over 4 GiB; but it
//! ends such chains *silently*, as if they were complete, and it never
//! checks where buffers point. [`parse_chain`] turns those cases into
//! errors: a chain whose last descriptor still says "next" was cut short; a
//! buffer must lie inside one guest RAM region; device-readable buffers
//! must come before device-writable ones; and a chain may hold at most a
//! device-chosen number of descriptors.
//!
//! The result, a [`ParsedChain`], is the chain as two byte streams (what
//! the device reads, what it writes) over checked guest ranges, so devices
//! need not assume how a driver split a request into descriptors (virtio
//! 1.x lets drivers lay buffers out as they like).

use std::ops::Deref;

use virtio_queue::DescriptorChain;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend};

use guestmem::GuestMemoryView;

/// A guest-physical byte range inside one guest RAM region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestRange {
    /// Guest-physical start.
    pub gpa: GuestAddress,
    /// Length; descriptors carry 32-bit lengths.
    pub len_bytes: u32,
}

/// What is wrong with a descriptor chain.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChainError {
    /// No descriptor could be read at all (bad head index or indirect table).
    #[error("the chain has no readable descriptor (bad head index or indirect table)")]
    Empty,
    /// The chain ended while its last descriptor still had a successor:
    /// it loops, is longer than its table, names a descriptor past the
    /// table, or exceeds 4 GiB.
    #[error("the chain is cut short: it loops, is longer than its table, names a descriptor outside the table or exceeds 4 GiB")]
    Truncated,
    /// More descriptors than the device accepts in one request.
    #[error("the chain has more than {max} descriptors")]
    TooLong {
        /// The device's limit.
        max: usize,
    },
    /// A buffer that is not inside one guest RAM region.
    #[error("buffer [{gpa:#x}, +{len_bytes:#x}) is not inside guest RAM")]
    OutsideRam {
        /// Start of the buffer.
        gpa: u64,
        /// Length of the buffer.
        len_bytes: u32,
    },
    /// A device-readable buffer after a device-writable one.
    #[error("a device-readable buffer follows a device-writable one")]
    ReadableAfterWritable,
    /// A request asks for bytes past the end of its buffers.
    #[error(
        "the request needs {want_bytes} bytes at offset {offset} but its buffers hold {have_bytes}"
    )]
    TooShort {
        /// Stream offset asked for.
        offset: u64,
        /// Bytes asked for.
        want_bytes: u64,
        /// Bytes the stream holds.
        have_bytes: u64,
    },
    /// The chain has no device-writable byte to put a status in.
    #[error("the chain has no device-writable byte for the status")]
    NoStatus,
}

/// A checked descriptor chain: its device-readable and device-writable
/// buffers, in order, each inside guest RAM.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedChain {
    /// Buffers the device reads (the driver's request), in chain order.
    pub readable: Vec<GuestRange>,
    /// Buffers the device writes (its response), in chain order.
    pub writable: Vec<GuestRange>,
}

/// Walks `chain` and checks it (see the module documentation). Zero-length
/// descriptors are allowed and dropped; they still count toward
/// `max_descriptors`.
pub fn parse_chain<M>(
    chain: DescriptorChain<M>,
    mem: &GuestMemoryView,
    max_descriptors: usize,
) -> Result<ParsedChain, ChainError>
where
    M: Deref<Target = GuestMemoryView>,
{
    let mut parsed = ParsedChain::default();
    let mut count = 0usize;
    let mut last_has_next = None;
    for desc in chain {
        count += 1;
        if count > max_descriptors {
            return Err(ChainError::TooLong {
                max: max_descriptors,
            });
        }
        last_has_next = Some(desc.has_next());
        let range = GuestRange {
            gpa: desc.addr(),
            len_bytes: desc.len(),
        };
        if desc.is_write_only() {
            if range.len_bytes > 0 {
                check_in_ram(mem, range)?;
                parsed.writable.push(range);
            }
        } else {
            if !parsed.writable.is_empty() {
                return Err(ChainError::ReadableAfterWritable);
            }
            if range.len_bytes > 0 {
                check_in_ram(mem, range)?;
                parsed.readable.push(range);
            }
        }
    }
    match last_has_next {
        None => Err(ChainError::Empty),
        Some(true) => Err(ChainError::Truncated),
        Some(false) => Ok(parsed),
    }
}

/// Whether `range` lies inside one region of `mem`.
fn check_in_ram(mem: &GuestMemoryView, range: GuestRange) -> Result<(), ChainError> {
    let outside = || ChainError::OutsideRam {
        gpa: range.gpa.raw_value(),
        len_bytes: range.len_bytes,
    };
    // get_slice succeeds only for a range inside a single region; a buffer
    // spanning two regions would also need two host pointers.
    let len = usize::try_from(range.len_bytes).map_err(|_| outside())?;
    mem.get_slice(range.gpa, len)
        .map(|_| ())
        .map_err(|_| outside())
}

/// The pieces of `ranges`, seen as one byte stream, that cover
/// `[offset, offset + len_bytes)` of the stream.
pub fn stream_slice(
    ranges: &[GuestRange],
    offset: u64,
    len_bytes: u64,
) -> Result<Vec<GuestRange>, ChainError> {
    let have_bytes = stream_len_bytes(ranges);
    let too_short = ChainError::TooShort {
        offset,
        want_bytes: len_bytes,
        have_bytes,
    };
    match offset.checked_add(len_bytes) {
        Some(end) if end <= have_bytes => {}
        _ => return Err(too_short),
    }
    let mut pieces = Vec::new();
    let mut skip = offset;
    let mut want = len_bytes;
    for range in ranges {
        if want == 0 {
            break;
        }
        let len = u64::from(range.len_bytes);
        if skip >= len {
            skip -= len;
            continue;
        }
        let take = (len - skip).min(want);
        pieces.push(GuestRange {
            gpa: range.gpa.unchecked_add(skip),
            // take <= len, which came from a u32.
            len_bytes: take as u32,
        });
        want -= take;
        skip = 0;
    }
    Ok(pieces)
}

/// Total bytes of `ranges`.
pub fn stream_len_bytes(ranges: &[GuestRange]) -> u64 {
    ranges.iter().map(|r| u64::from(r.len_bytes)).sum()
}

impl ParsedChain {
    /// Bytes the device may read.
    pub fn readable_len_bytes(&self) -> u64 {
        stream_len_bytes(&self.readable)
    }

    /// Bytes the device may write.
    pub fn writable_len_bytes(&self) -> u64 {
        stream_len_bytes(&self.writable)
    }

    /// Copies `buf.len()` bytes of the readable stream from `offset`.
    pub fn read_at(
        &self,
        mem: &GuestMemoryView,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), ChainError> {
        let mut done = 0usize;
        for piece in stream_slice(&self.readable, offset, buf.len() as u64)? {
            let len = piece.len_bytes as usize;
            mem.read_slice(&mut buf[done..done + len], piece.gpa)
                .map_err(|_| ChainError::OutsideRam {
                    gpa: piece.gpa.raw_value(),
                    len_bytes: piece.len_bytes,
                })?;
            done += len;
        }
        Ok(())
    }

    /// Copies `data` into the writable stream at `offset`.
    pub fn write_at(
        &self,
        mem: &GuestMemoryView,
        offset: u64,
        data: &[u8],
    ) -> Result<(), ChainError> {
        let mut done = 0usize;
        for piece in stream_slice(&self.writable, offset, data.len() as u64)? {
            let len = piece.len_bytes as usize;
            mem.write_slice(&data[done..done + len], piece.gpa)
                .map_err(|_| ChainError::OutsideRam {
                    gpa: piece.gpa.raw_value(),
                    len_bytes: piece.len_bytes,
                })?;
            done += len;
        }
        Ok(())
    }
}

/// Whether a guest range lies in RAM, for callers outside a chain (e.g.
/// balloon PFNs).
pub fn range_in_ram(mem: &GuestMemoryView, gpa: GuestAddress, len_bytes: u64) -> bool {
    match usize::try_from(len_bytes) {
        Ok(len) => mem.get_slice(gpa, len).is_ok(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use virtio_bindings::virtio_ring::{
        VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    };
    use virtio_queue::desc::{split::Descriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use virtio_queue::{Queue, QueueOwnedT};
    use vm_memory::GuestMemoryMmap;

    use super::*;

    const NEXT: u16 = VRING_DESC_F_NEXT as u16;
    const WRITE: u16 = VRING_DESC_F_WRITE as u16;
    const INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;

    fn memory() -> GuestMemoryMmap<()> {
        // Two regions with a hole between them, like guest RAM around 3 GiB.
        GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 0x10_0000),
            (GuestAddress(0x20_0000), 0x10_0000),
        ])
        .unwrap()
    }

    /// Stores `descs` at table indices 0.. and parses the chain headed at 0.
    fn parse(
        mem: &GuestMemoryMmap<()>,
        descs: &[(u64, u32, u16, u16)],
        max: usize,
    ) -> Result<ParsedChain, ChainError> {
        let vq = MockSplitQueue::create(mem, GuestAddress(0x1000), 16);
        for (i, &(addr, len, flags, next)) in descs.iter().enumerate() {
            vq.desc_table()
                .store(
                    i as u16,
                    RawDescriptor::from(Descriptor::new(addr, len, flags, next)),
                )
                .unwrap();
        }
        vq.avail().ring().ref_at(0).unwrap().store(0);
        vq.avail().idx().store(1);
        let mut queue: Queue = vq.create_queue().unwrap();
        let chain = queue.iter(mem).unwrap().next().unwrap();
        parse_chain(chain, mem, max)
    }

    #[test]
    fn a_good_chain_becomes_two_streams() {
        let mem = memory();
        let parsed = parse(
            &mem,
            &[
                (0x8000, 16, NEXT, 1),
                (0x9000, 0, NEXT, 2),
                (0x20_0000, 512, WRITE | NEXT, 3),
                (0xa000, 1, WRITE, 0),
            ],
            8,
        )
        .unwrap();
        assert_eq!(
            parsed.readable,
            vec![GuestRange {
                gpa: GuestAddress(0x8000),
                len_bytes: 16
            }]
        );
        assert_eq!(parsed.writable.len(), 2);
        assert_eq!(parsed.writable_len_bytes(), 513);
        parsed.write_at(&mem, 510, &[1, 2, 3]).unwrap();
        assert_eq!(
            mem.read_obj::<u16>(GuestAddress(0x20_01fe)).unwrap(),
            0x0201
        );
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0xa000)).unwrap(), 3);
        assert!(matches!(
            parsed.write_at(&mem, 512, &[0, 0]),
            Err(ChainError::TooShort { .. })
        ));
    }

    #[test]
    fn a_loop_is_cut_short() {
        let mem = memory();
        let err = parse(&mem, &[(0x8000, 16, NEXT, 1), (0x9000, 16, NEXT, 0)], 1000).unwrap_err();
        assert_eq!(err, ChainError::Truncated);
        // With a lower cap the length check comes first.
        let err = parse(&mem, &[(0x8000, 16, NEXT, 1), (0x9000, 16, NEXT, 0)], 4).unwrap_err();
        assert_eq!(err, ChainError::TooLong { max: 4 });
    }

    #[test]
    fn a_next_index_outside_the_table_is_cut_short() {
        let mem = memory();
        let err = parse(&mem, &[(0x8000, 16, NEXT, 200)], 8).unwrap_err();
        assert_eq!(err, ChainError::Truncated);
    }

    #[test]
    fn buffers_must_be_inside_one_region() {
        let mem = memory();
        for (addr, len) in [
            (0x18_0000u64, 16u32),
            (0xf_fff0, 0x20),
            (u64::MAX - 4, 16),
            (0x30_0000, 1),
        ] {
            let err = parse(&mem, &[(addr, len, WRITE, 0)], 8).unwrap_err();
            assert!(
                matches!(err, ChainError::OutsideRam { .. }),
                "{addr:#x}: {err:?}"
            );
        }
    }

    #[test]
    fn readable_after_writable_is_refused() {
        let mem = memory();
        let err = parse(&mem, &[(0x8000, 1, WRITE | NEXT, 1), (0x9000, 16, 0, 0)], 8).unwrap_err();
        assert_eq!(err, ChainError::ReadableAfterWritable);
    }

    #[test]
    fn a_bad_indirect_table_gives_an_empty_chain() {
        let mem = memory();
        // Length not a multiple of 16.
        let err = parse(&mem, &[(0x8000, 17, INDIRECT, 0)], 8).unwrap_err();
        assert_eq!(err, ChainError::Empty);
        // Table outside RAM.
        let err = parse(&mem, &[(0x18_0000, 32, INDIRECT, 0)], 8).unwrap_err();
        assert_eq!(err, ChainError::Empty);
    }

    #[test]
    fn stream_slices_split_across_ranges() {
        let ranges = [
            GuestRange {
                gpa: GuestAddress(0x1000),
                len_bytes: 10,
            },
            GuestRange {
                gpa: GuestAddress(0x5000),
                len_bytes: 10,
            },
        ];
        assert_eq!(
            stream_slice(&ranges, 8, 4).unwrap(),
            vec![
                GuestRange {
                    gpa: GuestAddress(0x1008),
                    len_bytes: 2
                },
                GuestRange {
                    gpa: GuestAddress(0x5000),
                    len_bytes: 2
                }
            ]
        );
        assert_eq!(stream_slice(&ranges, 20, 0).unwrap(), vec![]);
        assert!(stream_slice(&ranges, 19, 2).is_err());
        assert!(stream_slice(&ranges, u64::MAX, 2).is_err());
    }
}
