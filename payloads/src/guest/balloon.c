/*
 * balloon - drives a virtio-balloon device from the guest: free page
 * reporting must make the host drop whole free 2 MiB chunks and nothing
 * else; inflate and deflate must be accepted.
 *
 * vCPU 0 finds the first virtio-balloon device (DeviceID 5) among the boot
 * info's virtio-mmio devices (protocol version 2) and negotiates
 * VERSION_1 and VIRTIO_BALLOON_F_REPORTING (bit 5), plus STATS_VQ (bit 1)
 * with stats=1. Queues, numbered as the spec says for these features:
 * inflate 0, deflate 1, statistics 2 (stats=1 only), reporting 2 or 3.
 * Other vCPUs return 0 at once.
 *
 * It picks chunks+2 consecutive 2 MiB-aligned chunks of free RAM (the
 * lowest ones; the SDK's virtio arena for the rings sits at the top):
 *   C[0..chunks)   written with a non-zero pattern, then reported free;
 *   C[chunks]      written with the pattern, only its first 1 MiB reported
 *                  (a partial chunk: the host must keep all of it);
 *   C[chunks+1]    16 of its 4 KiB pages are inflated, then deflated.
 * The reports go out as three chains, made available together with one
 * notification, every descriptor device-writable (virtio 1.x, 5.5.6.7):
 *   { C[0], first half of C[chunks] }
 *   { C[1] as two 1 MiB halves }                   (chunks >= 2)
 *   { C[2..chunks) as one range }                  (chunks >= 3)
 * Once all three are back, each C[i < chunks] must read as zero everywhere
 * if expect_drop=1 (the host dropped it). With expect_drop=0 a chunk may
 * also still hold its pattern (a host that cannot drop, or chooses not
 * to: the content of reported pages is the device's to discard or keep),
 * but never a mix of both or anything else. C[chunks] must hold its
 * pattern in both cases: a partial report must not drop anything.
 * With stats=1 one statistics buffer (total and free memory) is given to
 * the device, which keeps it.
 *
 * With follow=1 it sets the device up the same way but reports nothing:
 * it follows the host's target (the balloon's size set at run time). It
 * polls the configuration field num_pages until it is non-zero, for at
 * most wait_gcycles x 2^30 TSC cycles, meanwhile handing a fresh
 * statistics report to the device whenever the device gives the buffer
 * back (stats=1). Then it takes ceil(num_pages / 512) consecutive free
 * chunks (the lowest ones), writes the pattern over them, inflates their
 * first num_pages pages (1024 PFNs per request), writes `actual` =
 * num_pages and checks what the host did:
 * every wholly inflated chunk must read as zero (expect_drop=1) or, with
 * expect_drop=0, as zero or all its pattern; in a partly inflated chunk
 * the pages not inflated must keep their pattern and the inflated ones
 * hold zero or their pattern (the host drops whole chunks only). Reading
 * inflated pages is what a real driver never does; here it is the check.
 *
 * Arguments: chunks=N (whole chunks reported, 1 to 64, default 4),
 * expect_drop=0|1 (default 1), stats=0|1 (default 1), follow=0|1 (default
 * 0), wait_gcycles=N (follow=1: how long to wait for a target, 1 to
 * 100000, default 300, about 100 s at 3 GHz).
 *
 * Output (vCPU 0), status 0:
 *   balloon ok dropped_chunks=<n> kept_partial=1
 * (n = whole chunks that read as zero: all of them with expect_drop=1), or
 * with follow=1:
 *   balloon follow ok target_pages=<t> dropped_chunks=<n>
 * Errors, status 1:
 *   balloon: <what went wrong>
 * No virtio-balloon device, status 2:
 *   balloon: no virtio-balloon device (boot info version <v>, <m> mmio
 *   devices)
 */
#include "common.h"
#include "virtio.h"

#define CHUNK      (2ull << 20)
#define HALF_CHUNK (1ull << 20)
#define MAX_CHUNKS 64

/* Feature bits and configuration space (virtio 1.x, 5.5). */
#define BALLOON_F_STATS_VQ  1
#define BALLOON_F_REPORTING 5
#define BALLOON_CFG_NUM_PAGES 0
#define BALLOON_CFG_ACTUAL    4
#define BALLOON_PFN_SHIFT     12

/* Statistics tags. */
#define BALLOON_S_MEMFREE 4
#define BALLOON_S_MEMTOT  5
#define BALLOON_S_AVAIL   6

#define QUEUE_SIZE 32
#define INFLATE_PAGES 16

/* follow=1 */
#define PAGES_PER_CHUNK    (CHUNK / PAGE_SIZE)
#define FOLLOW_BATCH_PAGES 1024 /* PFNs per inflate request: a 4 KiB array */
#define GCYCLES            (1ull << 30)
#define MAX_WAIT_GCYCLES   100000
/* Between two reads of num_pages: each read is an MMIO exit that costs the
 * host a lot more than the guest's spin. */
#define POLL_GAP_CYCLES    (1ull << 22)

struct balloon_stat {
    uint16_t tag;
    uint64_t val;
} __attribute__((packed));
_Static_assert(sizeof(struct balloon_stat) == 10, "layout");

/* The inflated pages: page numbers inside C[chunks + 1]. */
static const uint16_t inflate_pages[INFLATE_PAGES] = {
    0, 1, 2, 3, 4, 5, 6, 7, 9, 11, 100, 101, 102, 103, 300, 511,
};

static uint64_t pattern(uint64_t addr)
{
    return addr ^ pass_key(1); /* never 0 for an address below 2^63 */
}

static void fill(uint64_t start, uint64_t bytes)
{
    for (uint64_t a = start; a < start + bytes; a += 8)
        *(volatile uint64_t *)(uintptr_t)a = pattern(a);
}

/* Counts the words of [start, +bytes) that are zero and those that hold
 * the pattern; the rest are wrong (first one in *bad, else 0). */
struct census {
    uint64_t zero, pattern, other, bad;
};

static struct census survey(uint64_t start, uint64_t bytes)
{
    struct census c = { 0, 0, 0, 0 };
    for (uint64_t a = start; a < start + bytes; a += 8) {
        uint64_t v = *(volatile uint64_t *)(uintptr_t)a;
        if (v == 0) {
            c.zero++;
        } else if (v == pattern(a)) {
            c.pattern++;
        } else {
            if (c.other++ == 0)
                c.bad = a;
        }
    }
    return c;
}

/*
 * The lowest run of `n` consecutive 2 MiB-aligned chunks inside one free
 * range and below `limit` (the arena). Returns its start, or 0.
 */
static uint64_t find_chunks(const struct hvmm_boot_info *info, uint64_t n,
                            uint64_t limit)
{
    for (uint64_t i = 0; i < info->range_count; i++) {
        uint64_t start = (info->ranges[i].start + CHUNK - 1) & ~(CHUNK - 1);
        uint64_t end = info->ranges[i].end;
        if (end > limit)
            end = limit;
        if (end > start && (end - start) / CHUNK >= n)
            return start;
    }
    return 0;
}

struct balloon {
    struct virtio_dev dev;
    struct virtq inflate, deflate, stats, report;
    uint32_t *pfns;
    struct balloon_stat *stat;
};

/* Fills the statistics buffer (total and free memory) and gives it to the
 * device. */
static int submit_stats(struct balloon *b, const struct hvmm_boot_info *info)
{
    b->stat[0] = (struct balloon_stat){ BALLOON_S_MEMTOT, info->ram_bytes };
    b->stat[1] = (struct balloon_stat){ BALLOON_S_MEMFREE,
                                        hvmm_free_bytes(info) };
    b->stat[2] = (struct balloon_stat){ BALLOON_S_AVAIL,
                                        hvmm_free_bytes(info) };
    struct virtio_buf buf = { (uintptr_t)b->stat, 3 * sizeof(*b->stat), 0 };
    if (virtq_submit(&b->stats, &buf, 1) < 0)
        return -1;
    virtq_notify(&b->stats);
    return 0;
}

static int setup(struct balloon *b, const struct hvmm_boot_info *info,
                 struct virtio_arena *arena, int want_stats)
{
    uint64_t wanted = 1ull << BALLOON_F_REPORTING;
    if (want_stats)
        wanted |= 1ull << BALLOON_F_STATS_VQ;
    if (virtio_negotiate(&b->dev, wanted) != 0)
        return -1;
    if (!(b->dev.features & (1ull << BALLOON_F_REPORTING))) {
        hvmm_printf("balloon: the device does not offer free page reporting "
                    "(features 0x%lx)\n",
                    b->dev.offered);
        virtio_fail(&b->dev);
        return -1;
    }
    int stats = (b->dev.features & (1ull << BALLOON_F_STATS_VQ)) != 0;
    uint16_t next = 0;
    if (virtq_setup(&b->dev, &b->inflate, next++, QUEUE_SIZE, arena) != 0 ||
        virtq_setup(&b->dev, &b->deflate, next++, QUEUE_SIZE, arena) != 0 ||
        (stats &&
         virtq_setup(&b->dev, &b->stats, next++, QUEUE_SIZE, arena) != 0) ||
        virtq_setup(&b->dev, &b->report, next++, QUEUE_SIZE, arena) != 0)
        return -1;
    b->pfns = virtio_arena_alloc(arena, INFLATE_PAGES * 4, 64);
    b->stat = virtio_arena_alloc(arena, 3 * sizeof(*b->stat), 64);
    if (b->pfns == NULL || b->stat == NULL) {
        hvmm_printf("balloon: arena too small\n");
        return -1;
    }
    if (virtio_driver_ok(&b->dev) != 0)
        return -1;
    /* 5.5.6.3: the driver hands the device one statistics buffer at start;
     * the device keeps it until it wants an update. */
    if (stats && submit_stats(b, info) != 0)
        return -1;
    return 0;
}

/* Reports the chunks free, in three chains, and waits for all of them. */
static int report(struct balloon *b, uint64_t base, uint64_t n)
{
    uint64_t half = base + n * CHUNK;
    struct virtio_buf a[2] = { { base, CHUNK, 1 }, { half, HALF_CHUNK, 1 } };
    struct virtio_buf c1[2] = { { base + CHUNK, HALF_CHUNK, 1 },
                                { base + CHUNK + HALF_CHUNK, HALF_CHUNK, 1 } };
    struct virtio_buf rest = { base + 2 * CHUNK, (uint32_t)((n - 2) * CHUNK),
                               1 };
    unsigned chains = 0;
    if (virtq_submit(&b->report, a, 2) >= 0)
        chains++;
    if (n >= 2 && virtq_submit(&b->report, c1, 2) >= 0)
        chains++;
    if (n >= 3 && virtq_submit(&b->report, &rest, 1) >= 0)
        chains++;
    unsigned want = 1 + (n >= 2) + (n >= 3);
    if (chains != want) {
        hvmm_printf("balloon: could not queue the reports\n");
        return -1;
    }
    virtq_notify(&b->report);
    for (unsigned i = 0; i < chains; i++) {
        uint32_t head, len;
        if (virtq_wait(&b->report, &head, &len) != 0)
            return -1;
    }
    return 0;
}

/* Inflates the pages of the chunk at `chunk`, then deflates them. */
static int inflate_deflate(struct balloon *b, uint64_t chunk)
{
    for (unsigned i = 0; i < INFLATE_PAGES; i++)
        b->pfns[i] = (uint32_t)((chunk >> BALLOON_PFN_SHIFT) + inflate_pages[i]);
    struct virtio_buf buf = { (uintptr_t)b->pfns, INFLATE_PAGES * 4, 0 };
    uint32_t len;
    if (virtq_transfer(&b->inflate, &buf, 1, &len) != 0)
        return -1;
    virtio_config_write32(&b->dev, BALLOON_CFG_ACTUAL, INFLATE_PAGES);
    if (virtio_config_read32(&b->dev, BALLOON_CFG_ACTUAL) != INFLATE_PAGES) {
        hvmm_printf("balloon: the device did not take actual=%u\n",
                    INFLATE_PAGES);
        return -1;
    }
    if (virtq_transfer(&b->deflate, &buf, 1, &len) != 0)
        return -1;
    virtio_config_write32(&b->dev, BALLOON_CFG_ACTUAL, 0);
    /* The pages are ours again. */
    fill(chunk, 16 * PAGE_SIZE);
    return 0;
}

/*
 * follow=1: polls num_pages until the host sets a target (handing the
 * statistics buffer back whenever the device returns it). Returns the
 * target, or 0 if none came within wait_gcycles.
 */
static uint32_t wait_for_target(struct balloon *b,
                                const struct hvmm_boot_info *info,
                                uint64_t wait_gcycles)
{
    int stats = (b->dev.features & (1ull << BALLOON_F_STATS_VQ)) != 0;
    uint64_t start = hvmm_rdtsc();
    for (;;) {
        uint32_t target = virtio_config_read32(&b->dev, BALLOON_CFG_NUM_PAGES);
        if (target != 0)
            return target;
        uint32_t head, len;
        if (stats && virtq_poll(&b->stats, &head, &len) &&
            submit_stats(b, info) != 0)
            return 0;
        if (hvmm_rdtsc() - start > wait_gcycles * GCYCLES)
            return 0;
        uint64_t t = hvmm_rdtsc();
        while (hvmm_rdtsc() - t < POLL_GAP_CYCLES)
            __asm__ volatile("pause");
    }
}

/* Checks a chunk whose every page was inflated. Returns 1 if it was
 * dropped, 0 if kept whole, -1 (with a message) otherwise. */
static int check_inflated_chunk(uint64_t at, uint64_t expect_drop)
{
    struct census c = survey(at, CHUNK);
    if (c.other != 0) {
        hvmm_printf("balloon: inflated chunk 0x%lx holds a wrong word at "
                    "0x%lx\n",
                    at, c.bad);
        return -1;
    }
    if (c.zero != 0 && c.pattern != 0) {
        hvmm_printf("balloon: inflated chunk 0x%lx was dropped in part: %lu "
                    "zero words, %lu kept\n",
                    at, c.zero, c.pattern);
        return -1;
    }
    if (expect_drop && c.zero == 0) {
        hvmm_printf("balloon: inflated chunk 0x%lx kept its data "
                    "(expect_drop=1: the host should have dropped it)\n",
                    at);
        return -1;
    }
    return c.zero != 0;
}

/* follow=1: see the top of the file. */
static int follow(struct balloon *b, const struct hvmm_boot_info *info,
                  struct virtio_arena *arena, uint64_t wait_gcycles,
                  uint64_t expect_drop)
{
    uint32_t target = wait_for_target(b, info, wait_gcycles);
    if (target == 0) {
        hvmm_printf("balloon: the host set no balloon target within %lu "
                    "Gcycles (num_pages stayed 0): give --balloon-target or "
                    "run `hugevmm ctl --api-socket PATH balloon SIZE`\n",
                    wait_gcycles);
        return 1;
    }
    uint64_t pages = target;
    uint64_t whole = pages / PAGES_PER_CHUNK;
    uint64_t chunks = (pages + PAGES_PER_CHUNK - 1) / PAGES_PER_CHUNK;
    uint64_t base = find_chunks(info, chunks, arena->start);
    if (base == 0) {
        hvmm_printf("balloon: a target of %u pages needs %lu consecutive "
                    "free 2 MiB chunks below 0x%lx: give a smaller target or "
                    "more --mem\n",
                    target, chunks, arena->start);
        return 1;
    }
    uint32_t *pfns = virtio_arena_alloc(arena, FOLLOW_BATCH_PAGES * 4, 64);
    if (pfns == NULL) {
        hvmm_printf("balloon: arena too small\n");
        return 1;
    }
    fill(base, chunks * CHUNK);
    for (uint64_t done = 0; done < pages;) {
        uint64_t n = pages - done;
        if (n > FOLLOW_BATCH_PAGES)
            n = FOLLOW_BATCH_PAGES;
        for (uint64_t i = 0; i < n; i++)
            pfns[i] = (uint32_t)((base >> BALLOON_PFN_SHIFT) + done + i);
        struct virtio_buf buf = { (uintptr_t)pfns, (uint32_t)(n * 4), 0 };
        uint32_t len;
        if (virtq_transfer(&b->inflate, &buf, 1, &len) != 0)
            return 1;
        done += n;
    }
    virtio_config_write32(&b->dev, BALLOON_CFG_ACTUAL, target);
    if (virtio_config_read32(&b->dev, BALLOON_CFG_ACTUAL) != target) {
        hvmm_printf("balloon: the device did not take actual=%u\n", target);
        return 1;
    }

    uint64_t dropped = 0;
    for (uint64_t i = 0; i < whole; i++) {
        int r = check_inflated_chunk(base + i * CHUNK, expect_drop);
        if (r < 0)
            return 1;
        dropped += (uint64_t)r;
    }
    if (chunks > whole) {
        uint64_t at = base + whole * CHUNK;
        uint64_t inflated_bytes = (pages - whole * PAGES_PER_CHUNK) * PAGE_SIZE;
        for (uint64_t page = at; page < at + inflated_bytes; page += PAGE_SIZE) {
            struct census c = survey(page, PAGE_SIZE);
            if (c.zero != 0 && c.pattern != 0) {
                hvmm_printf("balloon: inflated page 0x%lx was dropped in "
                            "part\n",
                            page);
                return 1;
            }
            if (c.other != 0) {
                hvmm_printf("balloon: inflated page 0x%lx holds a wrong "
                            "word at 0x%lx\n",
                            page, c.bad);
                return 1;
            }
        }
        struct census rest = survey(at + inflated_bytes, CHUNK - inflated_bytes);
        if (rest.pattern != (CHUNK - inflated_bytes) / 8) {
            hvmm_printf("balloon: the partly inflated chunk 0x%lx lost data "
                        "outside the balloon: %lu zero words, %lu wrong\n",
                        at, rest.zero, rest.other);
            return 1;
        }
    }
    hvmm_printf("balloon follow ok target_pages=%u dropped_chunks=%lu\n",
                target, dropped);
    return 0;
}

int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info)
{
    uint64_t chunks = 4, expect_drop = 1, want_stats = 1, want_follow = 0;
    uint64_t wait_gcycles = 300;
    const struct hvmm_arg_spec specs[] = {
        { "chunks", HVMM_ARG_NUMBER, &chunks, HVMM_ARG_RANGE(1, MAX_CHUNKS) },
        { "expect_drop", HVMM_ARG_NUMBER, &expect_drop, HVMM_ARG_RANGE(0, 1) },
        { "stats", HVMM_ARG_NUMBER, &want_stats, HVMM_ARG_RANGE(0, 1) },
        { "follow", HVMM_ARG_NUMBER, &want_follow, HVMM_ARG_RANGE(0, 1) },
        { "wait_gcycles", HVMM_ARG_NUMBER, &wait_gcycles,
          HVMM_ARG_RANGE(1, MAX_WAIT_GCYCLES) },
        HVMM_ARG_END,
    };
    if (hvmm_parse_args(info, "balloon", specs, vcpu == 0) != 0)
        return 2;
    if (vcpu != 0)
        return 0;

    struct balloon b;
    memset(&b, 0, sizeof(b));
    if (virtio_find(info, VIRTIO_ID_BALLOON, 0, &b.dev) != 0) {
        uint64_t count;
        hvmm_mmio_devices(info, &count);
        hvmm_printf("balloon: no virtio-balloon device (boot info version "
                    "%u, %lu mmio devices)\n",
                    info->version, count);
        return 2;
    }
    struct virtio_arena arena;
    uint64_t arena_bytes = 64 << 10;
    if (virtio_arena_init(&arena, info, arena_bytes) == 0) {
        hvmm_printf("balloon: no free range holds %lu bytes for the rings\n",
                    arena_bytes);
        return 1;
    }
    if (want_follow) {
        if (setup(&b, info, &arena, (int)want_stats) != 0)
            return 1;
        return follow(&b, info, &arena, wait_gcycles, expect_drop);
    }
    uint64_t base = find_chunks(info, chunks + 2, arena.start);
    if (base == 0) {
        hvmm_printf("balloon: free RAM has no %lu consecutive 2 MiB-aligned "
                    "chunks below 0x%lx (use more --mem or fewer chunks=)\n",
                    chunks + 2, arena.start);
        return 1;
    }
    if (setup(&b, info, &arena, (int)want_stats) != 0)
        return 1;

    uint64_t half = base + chunks * CHUNK;
    fill(base, (chunks + 1) * CHUNK);
    if (report(&b, base, chunks) != 0)
        return 1;

    uint64_t dropped = 0;
    for (uint64_t i = 0; i < chunks; i++) {
        uint64_t at = base + i * CHUNK;
        struct census c = survey(at, CHUNK);
        if (c.other != 0) {
            hvmm_printf("balloon: chunk 0x%lx holds a wrong word at 0x%lx\n",
                        at, c.bad);
            return 1;
        }
        if (c.zero != 0 && c.pattern != 0) {
            hvmm_printf("balloon: chunk 0x%lx was dropped in part: %lu zero "
                        "words, %lu kept\n",
                        at, c.zero, c.pattern);
            return 1;
        }
        if (c.zero != 0)
            dropped++;
        if (expect_drop && c.zero == 0) {
            hvmm_printf("balloon: chunk 0x%lx was reported free but kept its "
                        "data (expect_drop=1: the host should have dropped "
                        "it)\n",
                        at);
            return 1;
        }
    }
    struct census h = survey(half, CHUNK);
    if (h.pattern != CHUNK / 8) {
        hvmm_printf("balloon: the partly reported chunk 0x%lx lost data: %lu "
                    "zero words, %lu wrong (first at 0x%lx)\n",
                    half, h.zero, h.other, h.bad);
        return 1;
    }

    if (inflate_deflate(&b, half + CHUNK) != 0)
        return 1;

    hvmm_printf("balloon ok dropped_chunks=%lu kept_partial=1\n", dropped);
    return 0;
}
