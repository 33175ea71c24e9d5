//! The seeds reach what they are meant to: a fuzzer starting from seeds
//! that fail early would only ever explore the first checks.

use hugevmm_fuzz::seeds::{bzimage, compressed_payloads, seeds, tiny_vmlinux};
use hugevmm_fuzz::{virtio_balloon, virtio_blk};
use vm_memory::{Bytes, GuestAddress};

fn seed(target: &str, name: &str) -> Vec<u8> {
    seeds(target)
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no seed {name} for {target}"))
        .1
}

#[test]
fn blk_seeds_complete_with_status_ok() {
    for (name, data_bytes) in [
        ("read", 1024),
        ("get-id", 20),
        ("write", 0),
        ("flush", 0),
        ("indirect", 512),
    ] {
        let (used, mem) = virtio_blk::exercise(&seed("virtio_blk", name));
        assert_eq!(used.len(), 1, "{name}: {used:?}");
        assert_eq!(
            used[0],
            (0, data_bytes + 1),
            "{name}: head 0, data and status written"
        );
        let status: u8 = mem.read_obj(GuestAddress(0x3000)).unwrap();
        assert_eq!(status, 0, "{name}: VIRTIO_BLK_S_OK");
    }
    for name in ["discard", "write-zeroes"] {
        let (used, mem) = virtio_blk::exercise(&seed("virtio_blk", name));
        assert_eq!(used.len(), 1, "{name}: {used:?}");
        let status: u8 = mem.read_obj(GuestAddress(0x3000)).unwrap();
        assert!(status <= 2, "{name}: status {status}");
    }
}

#[test]
fn balloon_seeds_reach_the_sink_and_the_statistics() {
    let inflate = virtio_balloon::exercise(&seed("virtio_balloon", "inflate"));
    assert_eq!(inflate.inflated_pages, 512);
    assert_eq!(inflate.freed, vec![(8 << 20, 2 << 20)]);
    let deflate = virtio_balloon::exercise(&seed("virtio_balloon", "deflate"));
    assert_eq!(deflate.inflated_pages, 0);
    let stats = virtio_balloon::exercise(&seed("virtio_balloon", "stats"));
    assert_eq!(stats.stats_reports, 1);
    let report = virtio_balloon::exercise(&seed("virtio_balloon", "report"));
    assert_eq!(report.freed, vec![(8 << 20, 2 << 20)]);
}

#[test]
fn kernel_seeds_decompress_to_the_tiny_vmlinux() {
    let payloads = compressed_payloads();
    assert_eq!(payloads.len(), 6);
    for (name, payload) in payloads {
        let image = bzimage(&payload);
        assert_eq!(&image[0x202..0x206], b"HdrS", "{name}");
        // The target asserts on what it gets; a seed that failed to
        // decompress would return early, which the next check catches.
        hugevmm_fuzz::kernel_image::run(&seed("kernel_image", &format!("bzimage-{name}")));
        assert!(
            hugevmm_fuzz::kernel_image::boots(&image, 64 << 20),
            "{name}"
        );
    }
    assert!(hugevmm_fuzz::kernel_image::boots(&tiny_vmlinux(), 64 << 20));
}

#[test]
fn engine_seeds_reach_the_granularity_policy_the_retry_layer_and_sealing() {
    use hugevmm_fuzz::engine::run_input;
    let auto = run_input(&seed("engine", "auto-refaults"));
    assert!(auto.completed, "{auto:?}");
    let split = &auto.stats.split;
    assert!(
        split.splits_by_reason.thrashing > 0 && split.page_faults.store > 0,
        "auto: no chunk split for thrashing and faulted back page by page: {:?}",
        auto.stats
    );
    assert!(
        split.collapses_by_reason.dense > 0,
        "auto: no split chunk collapsed when used densely: {:?}",
        auto.stats
    );
    let retry = run_input(&seed("engine", "retry-transient"));
    assert!(retry.completed, "{retry:?}");
    let r = retry.store;
    assert!(
        r.injected.transient_errors > 0 && r.retry.retries > 0,
        "no EIO injected and retried: {r:?}"
    );
    assert!(
        r.injected.transient_corruptions > 0 && r.retry.checksum_recovered > 0,
        "no checksum failure injected and read again: {r:?}"
    );
    assert!(r.injected.delays > 0, "no delay injected: {r:?}");
    let sealed = run_input(&seed("engine", "sealed-auto"));
    let s = sealed.store;
    assert!(s.sealed, "{s:?}");
    assert!(
        !sealed.completed && s.retry.auth_rereads > 0 && s.retry.auth_fatal > 0,
        "the damaged sealed slot must fail authentication twice and end the run: {sealed:?}"
    );
}
