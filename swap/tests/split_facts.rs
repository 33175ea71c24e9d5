//! The kernel facts split chunks rest on (issue 13's spike), asserted
//! against this machine's kernel: what a 4 KiB install or move does to a
//! chunk's PMD, whether a THP moved into an emptied chunk maps 2 MiB, and
//! what `MADV_COLLAPSE` needs on a userfaultfd-registered range. The
//! findings are written up in docs/KERNEL_FACTS.md ("Mixing 2 MiB and
//! 4 KiB in one chunk"); each test prints what it saw.

use guestmem::addr::Hva;
use guestmem::addr::RegionOffset;
use guestmem::host::{AnonMapping, PagemapScanner, RawRange, HUGE_PAGE_BYTES, PAGE_BYTES};
use swap::uffd::{mode, CopyOptions, MoveOptions, Uffd, Userfaults};

const MB2: u64 = HUGE_PAGE_BYTES;

/// A registered guest-like range of `chunks` chunks (THP advised) and a
/// registered parking range of one chunk, on one userfaultfd.
struct Setup {
    uffd: Uffd,
    guest: AnonMapping,
    parking: AnonMapping,
    pagemap: PagemapScanner,
}

impl Setup {
    fn new(chunks: u64, modes: u64) -> Setup {
        let uffd = Uffd::open(0).unwrap();
        let guest = AnonMapping::new(chunks * MB2).unwrap();
        let parking = AnonMapping::new(MB2).unwrap();
        for m in [&guest, &parking] {
            m.range()
                .advise_hugepage(RegionOffset::ZERO, m.range().len())
                .unwrap();
            // SAFETY: the test owns these mappings, reaches them through
            // raw addresses only, and never touches an empty page of them.
            unsafe { uffd.register(Hva::new(m.range().base()), m.range().len(), modes) }.unwrap();
        }
        Setup {
            uffd,
            guest,
            parking,
            pagemap: PagemapScanner::open().unwrap(),
        }
    }

    fn g(&self) -> RawRange {
        *self.guest.range()
    }

    fn huge(&self, chunk: u64) -> bool {
        self.pagemap
            .is_huge(self.guest.range(), RegionOffset::new(chunk * MB2), MB2)
            .unwrap()
    }

    /// Installs a THP buffer filled with `value` on chunk `chunk` by MOVE.
    fn install_thp(&self, chunk: u64, value: u8) {
        let buf = thp_buffer(value);
        // SAFETY: the chunk is empty and the buffer ours; raw addresses only.
        unsafe {
            self.uffd.move_all(
                Hva::new(self.g().base() + chunk * MB2),
                Hva::new(buf.range().base()),
                MB2,
                MoveOptions::default(),
            )
        }
        .unwrap();
    }

    /// Copies one 4 KiB page filled with `value` onto page `page` of the range.
    fn copy_page(&self, page: u64, value: u8) -> Result<(), swap::uffd::UffdError> {
        let src = AnonMapping::new(MB2).unwrap();
        src.range().touch(RegionOffset::ZERO, PAGE_BYTES);
        // SAFETY: our own populated buffer.
        unsafe { src.range().slice_mut(RegionOffset::ZERO, PAGE_BYTES) }.fill(value);
        self.uffd.copy_all(
            Hva::new(self.g().base() + page * PAGE_BYTES),
            Hva::new(src.range().base()),
            PAGE_BYTES,
            CopyOptions::default(),
        )
    }

    fn byte(&self, offset: u64) -> u8 {
        // SAFETY: the test only reads pages it knows are present.
        unsafe { self.g().slice(RegionOffset::new(offset), 1)[0] }
    }
}

fn thp_buffer(value: u8) -> AnonMapping {
    let buf = AnonMapping::new(MB2).unwrap();
    buf.range()
        .advise_hugepage(RegionOffset::ZERO, MB2)
        .unwrap();
    buf.range().touch(RegionOffset::ZERO, MB2);
    // SAFETY: the buffer is ours, populated, and not shared.
    unsafe { buf.range().slice_mut(RegionOffset::ZERO, MB2) }.fill(value);
    buf
}

const PAGES: u64 = MB2 / PAGE_BYTES;

#[test]
fn a_4k_move_out_of_a_huge_chunk_splits_its_pmd_and_keeps_the_other_pages() {
    let s = Setup::new(2, mode::MISSING);
    s.install_thp(0, 0x5a);
    assert!(s.huge(0), "MOVE of a THP into an empty chunk maps it huge");
    // SAFETY: page 7 is present; parking page 7 is empty; raw addresses.
    unsafe {
        s.uffd.move_all(
            Hva::new(s.parking.range().base() + 7 * PAGE_BYTES),
            Hva::new(s.g().base() + 7 * PAGE_BYTES),
            PAGE_BYTES,
            MoveOptions::default(),
        )
    }
    .unwrap();
    assert!(!s.huge(0), "the chunk's PMD was split");
    let mut residency = Vec::new();
    s.g()
        .residency(RegionOffset::ZERO, MB2, &mut residency)
        .unwrap();
    let present = residency.iter().filter(|&&r| r & 1 != 0).count();
    assert_eq!(present as u64, PAGES - 1, "exactly the moved page left");
    assert_eq!(s.byte(8 * PAGE_BYTES), 0x5a);
    // SAFETY: the moved page is present in the parking range now.
    let parked = unsafe {
        s.parking
            .range()
            .slice(RegionOffset::new(7 * PAGE_BYTES), 1)[0]
    };
    assert_eq!(parked, 0x5a);
    println!("4 KiB MOVE out of a huge chunk: PMD split, {present} pages stay mapped");
}

#[test]
fn copy_onto_a_huge_chunk_is_eexist() {
    let s = Setup::new(1, mode::MISSING);
    s.install_thp(0, 1);
    let e = s.copy_page(3, 2).unwrap_err();
    assert!(e.is_eexist(), "{e}");
    assert_eq!(s.byte(3 * PAGE_BYTES), 1, "nothing was overwritten");
}

#[test]
fn a_thp_moved_into_a_chunk_that_held_4k_pages_maps_huge_only_after_dontneed() {
    let s = Setup::new(1, mode::MISSING);
    // A 4 KiB install gives the chunk a page table; moving the page back out
    // leaves the table empty but in place.
    s.copy_page(5, 9).unwrap();
    // SAFETY: page 5 is present, parking page 5 empty; raw addresses.
    unsafe {
        s.uffd.move_all(
            Hva::new(s.parking.range().base() + 5 * PAGE_BYTES),
            Hva::new(s.g().base() + 5 * PAGE_BYTES),
            PAGE_BYTES,
            MoveOptions::default(),
        )
    }
    .unwrap();
    s.install_thp(0, 3);
    let huge_with_table = s.huge(0);
    assert_eq!(
        s.byte(100 * PAGE_BYTES),
        3,
        "the content arrived either way"
    );
    // Empty the chunk again and drop its page table.
    s.g().discard(RegionOffset::ZERO, MB2).unwrap();
    s.install_thp(0, 4);
    let huge_after_dontneed = s.huge(0);
    println!(
        "THP moved into a chunk whose PMD holds an empty page table: huge={huge_with_table}; \
         after MADV_DONTNEED of the 2 MiB: huge={huge_after_dontneed}"
    );
    assert!(
        !huge_with_table,
        "the kernel split the THP into the page table"
    );
    assert!(
        huge_after_dontneed,
        "MADV_DONTNEED freed the page table (PT_RECLAIM)"
    );
    assert_eq!(s.byte(200 * PAGE_BYTES), 4);
}

#[test]
fn madv_collapse_on_a_registered_range_needs_every_page_present() {
    let s = Setup::new(3, mode::MISSING);
    // Chunk 0: all 512 pages installed 4 KiB by COPY.
    for page in 0..PAGES {
        s.copy_page(page, (page % 251) as u8).unwrap();
    }
    assert!(!s.huge(0));
    let full = s.g().collapse(RegionOffset::ZERO, MB2);
    let huge_full = s.huge(0);
    // Chunk 1: one page missing.
    for page in 0..PAGES - 1 {
        s.copy_page(PAGES + page, 7).unwrap();
    }
    let holed = s.g().collapse(RegionOffset::new(MB2), MB2);
    // Chunk 2: one page the zero page.
    for page in 1..PAGES {
        s.copy_page(2 * PAGES + page, 7).unwrap();
    }
    s.uffd
        .zeropage(Hva::new(s.g().base() + 2 * MB2), PAGE_BYTES, false)
        .unwrap();
    let zero = s.g().collapse(RegionOffset::new(2 * MB2), MB2);
    println!(
        "MADV_COLLAPSE, registered MISSING: all present {full:?} (huge {huge_full}); \
         one page missing {holed:?}; one zero page {zero:?}"
    );
    assert!(full.is_ok() && huge_full, "{full:?}");
    for page in [0, 1, 250, 511] {
        assert_eq!(
            s.byte(page * PAGE_BYTES),
            (page % 251) as u8,
            "content kept"
        );
    }
    assert!(holed.is_err(), "a missing page aborts the collapse");
    assert!(!s.huge(1));
    assert!(zero.is_err(), "a zero-page entry aborts the collapse");
}

#[test]
fn madv_collapse_is_aborted_by_a_write_protected_page() {
    let s = Setup::new(1, mode::MISSING | mode::WP);
    for page in 0..PAGES {
        s.copy_page(page, 1).unwrap();
    }
    s.uffd
        .write_protect(Hva::new(s.g().base() + 9 * PAGE_BYTES), PAGE_BYTES)
        .unwrap();
    let protected = s.g().collapse(RegionOffset::ZERO, MB2);
    s.uffd
        .write_unprotect(Hva::new(s.g().base() + 9 * PAGE_BYTES), PAGE_BYTES, false)
        .unwrap();
    let unprotected = s.g().collapse(RegionOffset::ZERO, MB2);
    println!(
        "MADV_COLLAPSE, registered MISSING|WP: one page write-protected {protected:?}; \
         after unprotecting it {unprotected:?} (huge {})",
        s.huge(0)
    );
    assert!(
        protected.is_err(),
        "a write-protected page aborts the collapse"
    );
    assert!(unprotected.is_ok() && s.huge(0), "{unprotected:?}");
}

/// `Userfaults::prepare_page_table` (what the engine does to a chunk that
/// leaves memory whole, docs/KERNEL_FACTS.md "A write fault over no page
/// table"): it maps nothing, a write there faults to the userfaultfd like
/// over an empty PMD, and a THP moved in after `MADV_DONTNEED` of the
/// chunk maps huge, while one moved onto the prepared table does not.
#[test]
fn a_prepared_page_table_maps_nothing_and_must_go_before_a_thp_moves_in() {
    let s = Setup::new(3, mode::MISSING);
    let chunk_addr = |chunk: u64| Hva::new(s.g().base() + chunk * MB2);
    for chunk in 0..3 {
        s.uffd.prepare_page_table(chunk_addr(chunk)).unwrap();
    }
    let mut residency = Vec::new();
    s.g()
        .residency(RegionOffset::ZERO, 3 * MB2, &mut residency)
        .unwrap();
    assert!(
        residency.iter().all(|&r| r & 1 == 0),
        "nothing is mapped under the prepared tables"
    );
    // A write over the prepared table reaches the userfaultfd as a
    // missing fault; serve it with one page.
    let target = s.g().base() + 5 * PAGE_BYTES;
    let writer = std::thread::spawn(move || {
        // SAFETY: the test's own registered mapping; the fault is served
        // below before the write completes.
        unsafe { std::ptr::write_volatile(target as *mut u8, 7) }
    });
    let mut events = Vec::new();
    while s.uffd.read_events(&mut events, 1).unwrap() == 0 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    println!("a write over a prepared table: {:?}", events[0]);
    s.copy_page(5, 0).unwrap();
    s.uffd
        .wake(Hva::new(target & !(PAGE_BYTES - 1)), PAGE_BYTES)
        .unwrap();
    writer.join().unwrap();
    assert_eq!(s.byte(5 * PAGE_BYTES), 7, "the write landed");
    s.copy_page(0, 1).unwrap();
    s.uffd.prepare_page_table(chunk_addr(0)).unwrap();
    assert_eq!(
        (s.byte(0), s.byte(5 * PAGE_BYTES)),
        (1, 7),
        "preparing over mapped pages leaves them as they were"
    );
    // Chunk 1: the table goes first, and the THP maps huge.
    s.g().discard(RegionOffset::new(MB2), MB2).unwrap();
    s.install_thp(1, 3);
    // Chunk 2: moved onto the prepared table, it is split into pages.
    s.install_thp(2, 4);
    println!(
        "THP moved in after MADV_DONTNEED: huge {}; onto the prepared table: huge {}",
        s.huge(1),
        s.huge(2)
    );
    assert!(s.huge(1), "MADV_DONTNEED removes the prepared table");
    assert!(!s.huge(2), "a THP moved onto a page table is split");
    assert_eq!((s.byte(MB2 + 9), s.byte(2 * MB2 + 9)), (3, 4));
}
