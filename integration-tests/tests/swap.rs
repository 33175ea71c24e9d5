//! The swap engine under real VMs: overcommitted guests keep every write,
//! refaulted chunks come back as 2 MiB KVM mappings, and store failures end
//! the run with the chunk's address.

use integration_tests::*;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(600);

fn verify_overcommitted(vcpus: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "run",
        "--payload",
        "verify",
        "--vcpus",
        vcpus,
        "--mem",
        "1G",
        "--mem-limit",
        "256M",
        "--payload-args",
        "passes=2",
    ];
    args.extend_from_slice(extra);
    let run = hugevmm(&args, LIMIT);
    run.expect_status(0);
    let evictions = run.stat("/swap/evictions");
    let store_faults = run.stat("/swap/faults/store");
    eprintln!(
        "verify vcpus={vcpus} {extra:?}: evictions={evictions} store_faults={store_faults} p50={}us p99={}us max={}us resident_max={} pages_2m={}",
        run.stat("/swap/fault_latency_us/p50"),
        run.stat("/swap/fault_latency_us/p99"),
        run.stat("/swap/fault_latency_us/max"),
        run.stat("/swap/resident_bytes_max"),
        run.stat("/kvm/pages_2m"),
    );
    // 1 GiB written twice through a 256 MiB window: most chunks leave and
    // come back at least once per generation.
    let unit = run.stat("/swap/unit_bytes");
    let chunks_per_gib = (1u64 << 30) / unit;
    assert!(
        evictions >= chunks_per_gib,
        "evictions {evictions} < {chunks_per_gib}"
    );
    assert!(
        store_faults >= chunks_per_gib / 2,
        "store faults {store_faults}"
    );
    assert!(
        run.stat("/swap/resident_bytes_max") <= 256 << 20,
        "limit exceeded"
    );
    run
}

#[test]
fn verify_on_two_vcpus_at_4x_overcommit() {
    if skip_without_kvm("verify_on_two_vcpus_at_4x_overcommit") {
        return;
    }
    verify_overcommitted("2", &[]);
}

#[test]
fn verify_on_four_vcpus_at_4x_overcommit_on_each_store() {
    if skip_without_kvm("verify_on_four_vcpus_each_store") {
        return;
    }
    verify_overcommitted("4", &[]);
    verify_overcommitted("4", &["--swap-store", "mem:lz4"]);
    let file = std::env::temp_dir().join(format!("hugevmm-swap-test-{}.img", std::process::id()));
    let spec = format!("file:{}", file.display());
    verify_overcommitted("4", &["--swap-store", &spec]);
    let _ = std::fs::remove_file(&file);
}

/// Every 3rd restore of a huge chunk splits it and every 3rd page fault on
/// a split chunk collapses it again (docs/SPLIT_CHUNKS.md): the split and
/// collapse transitions run thousands of times under 4 writing vCPUs at 4x
/// overcommit, and `verify` checks every word.
#[test]
fn verify_with_forced_splits_and_collapses_on_each_store() {
    if skip_without_kvm("verify_with_forced_splits") {
        return;
    }
    let file = temp_path("forced-split-store.img");
    let spec = format!("file:{}", file.display());
    for store in ["mem:lz4", spec.as_str(), "default"] {
        let mut extra = vec!["--force-split-every", "3"];
        if store != "default" {
            extra.extend_from_slice(&["--swap-store", store]);
        }
        let run = verify_overcommitted("4", &extra);
        let splits = run.stat("/swap/split/splits");
        let collapses = run.stat("/swap/split/collapses_verified");
        eprintln!(
            "forced splits on {store}: splits={splits} (absent {} stored {} staged {}) collapses_verified={collapses} by_madvise={} failures={} page_faults store={} zero={} page_evictions={} pages_written={}",
            run.stat("/swap/split/splits_by_origin/absent"),
            run.stat("/swap/split/splits_by_origin/stored"),
            run.stat("/swap/split/splits_by_origin/staged"),
            run.stat("/swap/split/collapses_by_madvise"),
            run.stats.as_ref().unwrap().pointer("/swap/split/collapse_failures").unwrap(),
            run.stat("/swap/split/page_faults/store"),
            run.stat("/swap/split/page_faults/zero"),
            run.stat("/swap/split/page_evictions"),
            run.stat("/swap/split/pages_written"),
        );
        assert!(splits >= 100, "{store}: only {splits} splits");
        assert!(
            collapses >= 50,
            "{store}: only {collapses} verified collapses"
        );
        assert!(
            run.stat("/swap/split/page_faults/store") > 0,
            "{store}: no page was read alone"
        );
        let _ = std::fs::remove_file(&file);
    }
}

/// Scattered hot pages beside a stream under the default unit (auto): the
/// hot chunks split and their pages move alone, the stream stays huge,
/// and the payload checks every hot word every round.
#[test]
fn mixed_work_under_auto_splits_the_hot_chunks() {
    if skip_without_kvm("mixed_work_under_auto") {
        return;
    }
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "mixed",
            "--vcpus",
            "2",
            "--mem",
            "512M",
            "--mem-limit",
            "96M",
            "--payload-args",
            "hot=64 stream=128M passes=2",
        ],
        LIMIT,
    );
    run.expect_status(0);
    assert!(run.stdout.contains("mixed vcpu=0") && run.stdout.contains(" ok"));
    let thrashing = run.stat("/swap/split/splits_by_reason/thrashing");
    let page_faults = run.stat("/swap/split/page_faults/store");
    let moved = run.stat("/swap/bytes_read") + run.stat("/swap/bytes_written");
    eprintln!(
        "mixed auto: thrashing splits={thrashing} page faults from the store={page_faults} store bytes moved={moved} flips={} collapses={}",
        run.stat("/swap/split/flips"),
        run.stat("/swap/split/collapses_verified")
    );
    assert!(thrashing >= 32, "the hot chunks split ({thrashing})");
    assert!(page_faults > 0, "hot pages came back alone");
    // 272 MiB of guest work; with 2 MiB units each hot touch moved a chunk
    // both ways (about 16 GiB here).
    assert!(moved < (4 * 272) << 20, "store bytes moved {moved}");
}

#[test]
fn forced_splits_are_refused_where_chunks_cannot_split() {
    for (args, want) in [
        (
            vec!["--swap-unit", "4k", "--force-split-every", "3"],
            "--swap-unit 2m and --backing thp",
        ),
        (
            vec!["--backing", "hugetlb", "--force-split-every", "3"],
            "--swap-unit 2m and --backing thp",
        ),
        (vec!["--force-split-every", "0"], "out of range"),
        // The fixed units never prefetch: asking for it is a mistake.
        (
            vec!["--swap-unit", "2m", "--prefetch"],
            "--prefetch is the auto unit's sequential prefetch",
        ),
    ] {
        let mut full = vec![
            "run",
            "--payload",
            "verify",
            "--mem",
            "64M",
            "--mem-limit",
            "32M",
        ];
        full.extend_from_slice(&args);
        let run = hugevmm(&full, Duration::from_secs(60));
        run.expect_status(1);
        assert!(run.stderr.contains(want), "{args:?}: {}", run.stderr);
    }
}

#[test]
fn small_page_ram_stays_small_pages_through_swapping() {
    if skip_without_kvm("small_page_ram_stays_small_pages_through_swapping") {
        return;
    }
    // --backing 4k is the small-page baseline: with the engine its unit is
    // the page, and nothing it restores is mapped 2 MiB.
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "seqwrite",
            "--vcpus",
            "2",
            "--mem",
            "256M",
            "--mem-limit",
            "64M",
            "--backing",
            "4k",
            "--payload-args",
            "bytes=128M passes=2",
        ],
        LIMIT,
    );
    run.expect_status(0);
    assert_eq!(run.stat("/swap/unit_bytes"), 4096, "{:?}", run.stats);
    assert!(run.stat("/swap/faults/store") > 0, "it swapped");
    assert_eq!(run.stat("/kvm/pages_2m"), 0, "{:?}", run.stats);
    assert_eq!(run.stat("/swap/restored_huge"), 0, "{:?}", run.stats);
    for unit in ["2m", "auto"] {
        let run = hugevmm(
            &[
                "run",
                "--payload",
                "hello",
                "--mem",
                "64M",
                "--mem-limit",
                "32M",
                "--backing",
                "4k",
                "--swap-unit",
                unit,
            ],
            Duration::from_secs(60),
        );
        run.expect_status(1);
        assert!(
            run.stderr.contains("--backing 4k") && run.stderr.contains("--backing thp"),
            "{unit}: {}",
            run.stderr
        );
    }
}

#[test]
fn verify_with_the_4k_baseline_unit() {
    if skip_without_kvm("verify_with_4k_unit") {
        return;
    }
    let run = verify_overcommitted("2", &["--swap-unit", "4k", "--swap-store", "mem:lz4"]);
    assert_eq!(run.stat("/swap/unit_bytes"), 4096);
}

/// seqwrite 512 MiB through a 256 MiB limit, twice: the second pass
/// refaults every chunk from the store.
fn seqwrite_refaulted(backing: &str) {
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "seqwrite",
            "--vcpus",
            "2",
            "--mem",
            "1G",
            "--mem-limit",
            "256M",
            "--backing",
            backing,
            "--payload-args",
            "bytes=512M passes=2",
        ],
        LIMIT,
    );
    run.expect_status(0);
    let resident_chunks = run.stat("/swap/resident_bytes") >> 21;
    let pages_2m = run.stat("/kvm/pages_2m");
    let store_faults = run.stat("/swap/faults/store");
    eprintln!("{backing}: resident_chunks={resident_chunks} pages_2m={pages_2m} store_faults={store_faults} restored_split={}", run.stat("/swap/restored_split"));
    assert!(
        store_faults >= 128,
        "the second pass refaults from the store ({store_faults})"
    );
    assert_mostly_huge(
        pages_2m,
        resident_chunks,
        &format!("{backing} after refaults"),
    );
}

#[test]
fn refaulted_chunks_are_mapped_2mib_on_thp() {
    if skip_without_kvm("refaulted_chunks_thp") {
        return;
    }
    seqwrite_refaulted("thp");
}

#[test]
fn refaulted_chunks_are_mapped_2mib_on_hugetlb() {
    if skip_without_kvm("refaulted_chunks_hugetlb") {
        return;
    }
    let _pages = match ensure_hugetlb_pages(512 + 8) {
        Ok(pages) => pages,
        Err(reason) => {
            skip("refaulted_chunks_hugetlb", Resource::Hugetlb, reason);
            return;
        }
    };
    seqwrite_refaulted("hugetlb");
}

#[test]
fn a_failing_store_ends_the_run_naming_the_chunk() {
    if skip_without_kvm("failing_store") {
        return;
    }
    for (fault, words) in [
        ("read-error-after=20", "i/o error"),
        ("corrupt-after=20", "checksum"),
        ("write-error-after=40", "i/o error"),
        ("full-after=40", "full"),
    ] {
        let spec = format!("faulty:{fault},inner=mem:lz4");
        let run = hugevmm(
            &[
                "run",
                "--payload",
                "verify",
                "--vcpus",
                "2",
                "--mem",
                "512M",
                "--mem-limit",
                "64M",
                "--swap-store",
                &spec,
                "--payload-args",
                "passes=2",
            ],
            LIMIT,
        );
        assert_eq!(run.status, Some(125), "{fault}: {}", run.stderr);
        assert!(
            run.stderr.contains("swap engine"),
            "{fault}: {}",
            run.stderr
        );
        assert!(
            run.stderr.contains("guest address 0x"),
            "{fault}: {}",
            run.stderr
        );
        assert!(
            run.stderr.to_lowercase().contains(words),
            "{fault}: {}",
            run.stderr
        );
        assert!(
            !run.stdout.contains("MISMATCH"),
            "no zero-filled chunk reached the guest: {}",
            run.stdout
        );
    }
}

/// Transient store faults (an EIO that passes when retried, a checksum
/// failure that a re-read does not meet) are absorbed by the retry policy
/// (docs/RETRY.md): the guest keeps every word, and the stats count them.
#[test]
fn transient_store_faults_are_retried_and_lose_nothing() {
    if skip_without_kvm("transient_store_faults") {
        return;
    }
    let run = verify_overcommitted(
        "2",
        &[
            "--swap-store",
            "faulty:transient-eio-every=20,transient-corrupt-every=10,delay-us=100,inner=mem:lz4",
        ],
    );
    let injected = run.stat("/swap/store/injected/transient_errors");
    let corruptions = run.stat("/swap/store/injected/transient_corruptions");
    assert!(injected > 0 && corruptions > 0, "{injected} {corruptions}");
    assert_eq!(run.stat("/swap/store/recovered"), injected);
    assert_eq!(run.stat("/swap/store/checksum_recovered"), corruptions);
    assert_eq!(run.stat("/swap/store/exhausted"), 0);
    assert_eq!(run.stat("/swap/store/checksum_fatal"), 0);
}

/// hugetlb guest RAM under eviction on 4 vCPUs: `verify` checks every word.
#[test]
fn verify_on_four_vcpus_on_hugetlb() {
    if skip_without_kvm("verify_on_four_vcpus_on_hugetlb") {
        return;
    }
    let _pages = match ensure_hugetlb_pages(512 + 64) {
        Ok(pages) => pages,
        Err(reason) => {
            skip("verify_on_four_vcpus_on_hugetlb", Resource::Hugetlb, reason);
            return;
        }
    };
    verify_overcommitted("4", &["--backing", "hugetlb"]);
}

/// The memory limit changes while the guest runs (`hugevmm ctl mem-limit`):
/// lowering it evicts down to the new cap, lifting it lets the guest
/// finish, and no write is lost on the way (the verify payload checks
/// every word). Bad limits are error replies.
#[test]
fn mem_limit_changes_at_run_time() {
    if skip_without_kvm("mem_limit_changes_at_run_time") {
        return;
    }
    let (vm, socket) = start_with_api_socket(&[
        "run",
        "--payload",
        "verify",
        "--vcpus",
        "2",
        "--mem",
        "256M",
        "--mem-limit",
        "192M",
        "--payload-args",
        "passes=40",
    ]);
    let low_bytes: u64 = 32 << 20;
    let reply = ctl(&socket, &["mem-limit", "32M"]);
    assert_eq!(reply["mem_limit_bytes"], low_bytes, "{reply}");
    // Eviction runs in the background: wait (bounded) until it is done.
    let mut tries = 0;
    let stats = loop {
        let stats = ctl(&socket, &["stats"]);
        let resident = stats["swap"]["resident_bytes"].as_u64().unwrap();
        if resident <= low_bytes {
            break stats;
        }
        tries += 1;
        assert!(
            tries < 3000,
            "resident memory never fell to the new limit: {stats}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(stats["swap"]["mem_limit_bytes"], low_bytes, "{stats}");

    // Refused: not whole chunks, too small to make progress, not a size.
    for (words, says) in [
        (&["mem-limit", "33M"][..], "multiple of the swap unit"),
        (&["mem-limit", "4M"][..], "need to make progress"),
        (&["mem-limit", "lots"][..], "mem-limit none"),
    ] {
        let mut args = vec!["ctl", "--api-socket", socket.to_str().unwrap()];
        args.extend_from_slice(words);
        let bad = hugevmm(&args, LIMIT);
        assert_eq!(bad.status, Some(1), "{words:?}: {}", bad.stderr);
        assert!(bad.stderr.contains(says), "{words:?}: {}", bad.stderr);
    }

    let reply = ctl(&socket, &["mem-limit", "none"]);
    assert!(reply["mem_limit_bytes"].is_null(), "{reply}");
    let run = vm.finish(LIMIT);
    run.expect_status(0);
    assert_eq!(run.stdout.matches(" ok").count(), 2, "{}", run.stdout);
    assert!(run.stat("/swap/evictions") > 0);
    assert!(run.stat("/swap/faults/store") > 0);
}

/// A limit below what the vCPUs need to make progress is refused at the
/// start, with the minimum in the message.
#[test]
fn too_small_a_mem_limit_is_refused() {
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "verify",
            "--vcpus",
            "2",
            "--mem",
            "64M",
            "--mem-limit",
            "8M",
        ],
        LIMIT,
    );
    assert_ne!(run.status, Some(0));
    assert!(
        run.stderr.contains("invalid --mem-limit") && run.stderr.contains("below the 24 MiB"),
        "{}",
        run.stderr
    );
}

/// `pageout` evicts everything while the guest runs, and the guest then
/// faults every chunk it took back from the store while `verify` checks
/// the words (a lost or zeroed word ends the guest with status 1 and a
/// MISMATCH line); `quit` ends the VM with status 0 and its statistics
/// written. The limit is all of RAM, so every store fault after the
/// pageout brings back a chunk the pageout took.
#[test]
fn pageout_and_quit_through_the_control_socket() {
    if skip_without_kvm("pageout_and_quit_through_the_control_socket") {
        return;
    }
    let (vm, socket) = start_with_api_socket(&[
        "run",
        "--payload",
        "verify",
        "--mem",
        "128M",
        "--mem-limit",
        "128M",
        // Far more passes than the test waits for: `quit` ends it.
        "--payload-args",
        "passes=100000",
    ]);
    // Let the guest write its words everywhere first (a generation over
    // 128 MiB, so the pageout takes written chunks, not zero ones).
    let written_everywhere = (0..6000).any(|_| {
        let stats = ctl(&socket, &["stats"]);
        std::thread::sleep(Duration::from_millis(10));
        stats["swap"]["resident_bytes"].as_u64().unwrap() >= 120 << 20
    });
    assert!(written_everywhere, "the guest never filled its RAM");
    let before = ctl(&socket, &["stats"])["swap"]["faults"]["store"]
        .as_u64()
        .unwrap();
    let reply = ctl(&socket, &["pageout"]);
    let taken = ["written_units", "clean_dropped_units"]
        .iter()
        .map(|k| reply[k].as_u64().unwrap())
        .sum::<u64>();
    assert!(reply["written_units"].as_u64().unwrap() > 0, "{reply}");
    // Every chunk the pageout took comes back from the store, and the
    // guest checks its words as it does (it reads each page before it
    // writes it).
    let restored = (0..6000).any(|_| {
        let stats = ctl(&socket, &["stats"]);
        let store = stats["swap"]["faults"]["store"].as_u64().unwrap();
        std::thread::sleep(Duration::from_millis(10));
        store - before >= taken
    });
    assert!(
        restored,
        "the guest did not fault back the {taken} chunks paged out"
    );
    assert_eq!(ctl(&socket, &["quit"])["quitting"], true);
    let run = vm.finish(LIMIT);
    run.expect_status(0);
    assert!(
        run.stderr.contains("quit through the API socket"),
        "{}",
        run.stderr
    );
    assert!(!run.stdout.contains("MISMATCH"), "{}", run.stdout);
    assert!(run.stat("/swap/faults/store") >= before + taken);
    assert!(run.stat("/swap/evictions") >= taken);
}

/// `hugevmm ctl --watch` follows a VM until it ends: a header, lines of
/// rates, exit 0.
#[test]
fn ctl_watch_follows_a_vm_to_its_end() {
    if skip_without_kvm("ctl_watch_follows_a_vm_to_its_end") {
        return;
    }
    let (vm, socket) = start_with_api_socket(&[
        "run",
        "--payload",
        "verify",
        "--mem",
        "128M",
        "--mem-limit",
        "64M",
        "--payload-args",
        "passes=20",
    ]);
    let watch = hugevmm(
        &[
            "ctl",
            "--api-socket",
            socket.to_str().unwrap(),
            "--watch",
            "0.05",
            "stats",
        ],
        LIMIT,
    );
    vm.finish(LIMIT).expect_status(0);
    watch.expect_status(0);
    let lines: Vec<&str> = watch.stdout.lines().collect();
    assert!(lines[0].contains("resident_MiB"), "{}", watch.stdout);
    assert!(lines.len() >= 2, "{}", watch.stdout);
    let columns = lines[0].split_whitespace().count();
    for line in &lines[1..] {
        assert_eq!(line.split_whitespace().count(), columns, "{line}");
    }
    assert!(
        watch.stderr.contains("the VM has ended"),
        "{}",
        watch.stderr
    );
}
