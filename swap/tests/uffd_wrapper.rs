//! Exercises the userfaultfd wrapper against this machine's kernel: the
//! facts the engine relies on are asserted here.

mod common;

use common::smaps::huge_and_rss_bytes;
use guestmem::addr::Hva;
use guestmem::addr::RegionOffset;
use guestmem::host::{AnonMapping, HUGE_PAGE_BYTES, PAGE_BYTES};
use swap::uffd::{
    feature, ioctl_bit, mode, CopyOptions, FaultKind, MoveOptions, Uffd, UffdEvent, Userfaults,
};

const MB2: u64 = HUGE_PAGE_BYTES;

fn next_fault(uffd: &Uffd) -> UffdEvent {
    let mut events = Vec::new();
    while events.is_empty() {
        assert!(uffd.poll_readable(5000).unwrap(), "no fault within 5 s");
        uffd.read_events(&mut events, 1).unwrap();
    }
    events[0]
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

#[test]
fn handshake_reports_move_and_wp() {
    let uffd = Uffd::open(0).unwrap();
    println!(
        "features {:#x} ioctls {:#x}",
        uffd.features(),
        uffd.api_ioctls()
    );
    assert!(uffd.has_move());
    assert!(uffd.features() & feature::PAGEFAULT_FLAG_WP != 0);
}

#[test]
fn move_installs_a_huge_pmd_and_wakes_the_faulting_thread() {
    let uffd = Uffd::open(0).unwrap();
    let guest = AnonMapping::new(4 * MB2).unwrap();
    let g = *guest.range();
    g.advise_hugepage(RegionOffset::ZERO, 4 * MB2).unwrap();
    // SAFETY: the test owns these mappings, reaches them through raw
    // addresses only, and serves the faults it causes itself.
    let ioctls =
        unsafe { uffd.register(Hva::new(g.base()), g.len(), mode::MISSING | mode::WP) }.unwrap();
    assert!(ioctls & (1 << ioctl_bit::MOVE) != 0, "ioctls {ioctls:#x}");
    let addr = g.base() + MB2 + 12345;
    let toucher = std::thread::spawn(move || {
        // SAFETY: reads a registered page; the test thread resolves it.
        unsafe { std::ptr::read_volatile(addr as *const u8) }
    });
    let ev = next_fault(&uffd);
    match ev {
        UffdEvent::PageFault { address, kind, .. } => {
            assert_eq!(address & !(PAGE_BYTES - 1), addr & !(PAGE_BYTES - 1));
            assert_eq!(kind, FaultKind::Missing);
        }
        other => panic!("unexpected {other:?}"),
    }
    let buf = thp_buffer(0xab);
    // SAFETY: the test owns these mappings, reaches them through raw
    // addresses only, and serves the faults it causes itself.
    unsafe {
        uffd.move_pages(
            Hva::new(g.base() + MB2),
            Hva::new(buf.range().base()),
            MB2,
            MoveOptions::default(),
        )
    }
    .unwrap();
    assert_eq!(toucher.join().unwrap(), 0xab);
    let (huge, rss) = huge_and_rss_bytes(g.base(), g.len());
    println!("after MOVE: AnonHugePages {huge} Rss {rss}");
    assert_eq!(huge, MB2);

    // Moving into the same place again: EEXIST (someone resolved it).
    let buf2 = thp_buffer(1);
    // SAFETY: the test owns these mappings, reaches them through raw
    // addresses only, and serves the faults it causes itself.
    let err = unsafe {
        uffd.move_pages(
            Hva::new(g.base() + MB2),
            Hva::new(buf2.range().base()),
            MB2,
            MoveOptions::default(),
        )
    }
    .unwrap_err();
    assert!(err.is_eexist(), "{err}");
    assert!(err.to_string().contains("UFFDIO_MOVE dst="), "{err}");

    // Moving out into an unregistered range fails with EINVAL; into a
    // registered parking area it works and keeps the PMD.
    let unreg = AnonMapping::new(MB2).unwrap();
    // SAFETY: the test owns these mappings, reaches them through raw
    // addresses only, and serves the faults it causes itself.
    let err = unsafe {
        uffd.move_pages(
            Hva::new(unreg.range().base()),
            Hva::new(g.base() + MB2),
            MB2,
            MoveOptions::default(),
        )
    }
    .unwrap_err();
    assert_eq!(err.errno(), Some(libc::EINVAL), "{err}");
    let park = AnonMapping::new(MB2).unwrap();
    // SAFETY: the test owns these mappings, reaches them through raw
    // addresses only, and serves the faults it causes itself.
    unsafe { uffd.register(Hva::new(park.range().base()), MB2, mode::MISSING) }.unwrap();
    // SAFETY: the test owns these mappings, reaches them through raw
    // addresses only, and serves the faults it causes itself.
    unsafe {
        uffd.move_pages(
            Hva::new(park.range().base()),
            Hva::new(g.base() + MB2),
            MB2,
            MoveOptions::default(),
        )
    }
    .unwrap();
    let (huge, _) = huge_and_rss_bytes(park.range().base(), MB2);
    assert_eq!(huge, MB2, "parked chunk stays huge");
    // SAFETY: the parked chunk is populated and owned by the test.
    assert!(unsafe { park.range().slice(RegionOffset::ZERO, MB2) }
        .iter()
        .all(|&b| b == 0xab));
    uffd.unregister(Hva::new(g.base()), g.len()).unwrap();
}

#[test]
fn write_protect_reports_wp_faults_and_unprotect_keeps_the_pmd() {
    let uffd = Uffd::open(0).unwrap();
    let guest = AnonMapping::new(MB2).unwrap();
    let g = *guest.range();
    g.advise_hugepage(RegionOffset::ZERO, MB2).unwrap();
    // SAFETY: the test owns these mappings, reaches them through raw
    // addresses only, and serves the faults it causes itself.
    unsafe { uffd.register(Hva::new(g.base()), MB2, mode::MISSING | mode::WP) }.unwrap();
    let buf = thp_buffer(7);
    // SAFETY: the test owns these mappings, reaches them through raw
    // addresses only, and serves the faults it causes itself.
    unsafe {
        uffd.move_pages(
            Hva::new(g.base()),
            Hva::new(buf.range().base()),
            MB2,
            MoveOptions::default(),
        )
    }
    .unwrap();
    uffd.write_protect(Hva::new(g.base()), MB2).unwrap();
    let addr = g.base() + 4096 * 3;
    let writer = std::thread::spawn(move || {
        // SAFETY: writes a registered, populated page; the test thread
        // resolves the write-protect fault.
        unsafe { std::ptr::write_volatile(addr as *mut u8, 9) };
    });
    match next_fault(&uffd) {
        UffdEvent::PageFault { kind, write, .. } => {
            assert_eq!(kind, FaultKind::WriteProtect);
            assert!(write);
        }
        other => panic!("unexpected {other:?}"),
    }
    uffd.write_unprotect(Hva::new(g.base()), MB2, false)
        .unwrap();
    writer.join().unwrap();
    let (huge, _) = huge_and_rss_bytes(g.base(), MB2);
    assert_eq!(huge, MB2, "unprotecting the whole chunk keeps the PMD");

    // Discarding a write-protected chunk: does the next touch fault
    // MISSING (no WP marker left on anonymous memory)?
    uffd.write_protect(Hva::new(g.base()), MB2).unwrap();
    g.discard(RegionOffset::ZERO, MB2).unwrap();
    let reader = std::thread::spawn(move || {
        // SAFETY: as above.
        unsafe { std::ptr::write_volatile(addr as *mut u8, 1) };
    });
    let kind = match next_fault(&uffd) {
        UffdEvent::PageFault { kind, .. } => kind,
        other => panic!("unexpected {other:?}"),
    };
    println!("touch after discard of a WP chunk faults {kind:?}");
    assert_eq!(kind, FaultKind::Missing);
    uffd.zeropage(Hva::new(g.base()), MB2, false).unwrap();
    reader.join().unwrap();
}

#[test]
fn copy_and_zeropage_and_move_of_small_pages() {
    let uffd = Uffd::open(0).unwrap();
    let guest = AnonMapping::new(MB2).unwrap();
    let g = *guest.range();
    g.advise_nohugepage(RegionOffset::ZERO, MB2).unwrap();
    // SAFETY: the test owns these mappings, reaches them through raw
    // addresses only, and serves the faults it causes itself.
    unsafe { uffd.register(Hva::new(g.base()), MB2, mode::MISSING | mode::WP) }.unwrap();
    let src = AnonMapping::new(MB2).unwrap();
    src.range().touch(RegionOffset::ZERO, MB2);
    // SAFETY: test-owned populated buffer.
    unsafe { src.range().slice_mut(RegionOffset::ZERO, PAGE_BYTES) }.fill(5);
    uffd.copy(
        Hva::new(g.base()),
        Hva::new(src.range().base()),
        PAGE_BYTES,
        CopyOptions {
            write_protect: true,
            dont_wake: false,
        },
    )
    .unwrap();
    let err = uffd
        .copy(
            Hva::new(g.base()),
            Hva::new(src.range().base()),
            PAGE_BYTES,
            CopyOptions::default(),
        )
        .unwrap_err();
    assert!(err.is_eexist());
    uffd.zeropage(Hva::new(g.base() + PAGE_BYTES), PAGE_BYTES, false)
        .unwrap();
    // SAFETY: the page was just populated by COPY.
    assert_eq!(unsafe { g.slice(RegionOffset::ZERO, 1) }[0], 5);
    // Move a copied page and a zero page out to a registered parking area.
    let park = AnonMapping::new(MB2).unwrap();
    // SAFETY: the test owns these mappings, reaches them through raw
    // addresses only, and serves the faults it causes itself.
    unsafe { uffd.register(Hva::new(park.range().base()), MB2, mode::MISSING) }.unwrap();
    // SAFETY: the test owns these mappings, reaches them through raw
    // addresses only, and serves the faults it causes itself.
    unsafe {
        uffd.move_pages(
            Hva::new(park.range().base()),
            Hva::new(g.base()),
            PAGE_BYTES,
            MoveOptions::default(),
        )
    }
    .unwrap();
    // SAFETY: the test owns these mappings, reaches them through raw
    // addresses only, and serves the faults it causes itself.
    let zero_move = unsafe {
        uffd.move_pages(
            Hva::new(park.range().base() + PAGE_BYTES),
            Hva::new(g.base() + PAGE_BYTES),
            PAGE_BYTES,
            MoveOptions::default(),
        )
    };
    println!("MOVE of a zero-page pte: {zero_move:?}");
    // Holes in the source: ENOENT unless allowed.
    // SAFETY: the test owns these mappings, reaches them through raw
    // addresses only, and serves the faults it causes itself.
    let err = unsafe {
        uffd.move_pages(
            Hva::new(park.range().base() + 2 * PAGE_BYTES),
            Hva::new(g.base() + 2 * PAGE_BYTES),
            PAGE_BYTES,
            MoveOptions::default(),
        )
    }
    .unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENOENT), "{err}");
    // SAFETY: the test owns these mappings, reaches them through raw
    // addresses only, and serves the faults it causes itself.
    unsafe {
        uffd.move_pages(
            Hva::new(park.range().base() + 2 * PAGE_BYTES),
            Hva::new(g.base() + 2 * PAGE_BYTES),
            PAGE_BYTES,
            MoveOptions {
                allow_src_holes: true,
                dont_wake: false,
            },
        )
    }
    .unwrap();
    let mut present = Vec::new();
    park.range()
        .residency(RegionOffset::ZERO, 4 * PAGE_BYTES, &mut present)
        .unwrap();
    println!("parking residency after moves: {present:?}");
    assert_eq!(present[0] & 1, 1);
    assert_eq!(present[2] & 1, 0);
}
