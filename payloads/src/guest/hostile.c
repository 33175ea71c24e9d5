/*
 * hostile - a guest that attacks the VMM from inside.
 *
 * Every vCPU but 0 churns memory (writes and checks a word in every 4 KiB
 * page of its share, so the swap engine faults and evicts under a
 * --mem-limit) between rounds of random port accesses (in and out of 1, 2
 * and 4 bytes at random ports, the VMM's console/exit/exception ports
 * left out, so the run goes on) and random accesses at random offsets of
 * the virtio-mmio windows (all sizes, in and past the register file).
 *
 * vCPU 0 attacks every virtio device it finds (--disk, --balloon):
 *   - random register reads and writes over the whole window;
 *   - queues of illegal sizes (0, not a power of two, past the maximum);
 *   - rings outside RAM (in the device hole, past the end of RAM, at
 *     the top of the address space, straddling RAM's end), and a
 *     descriptor table and available ring in the VMM region;
 *   - descriptor chains that loop, chains of more descriptors than the
 *     queue holds, indirect tables that nest or loop, heads past the
 *     table, buffers outside RAM or of 4 GiB, an available index a
 *     thousand entries ahead;
 *   - a reset with a request made available but not yet notified, a
 *     notification after the reset, a reset while the balloon holds the
 *     statistics buffer; balloon PFNs outside RAM and in the VMM region;
 *   - notifications at a high rate on valid, invalid and broken queues.
 * After each attack the device is reset and driven properly again; the
 * disk must then read back what was written (recovered=1 per disk).
 *
 * Then, with exceptions=1 (the default), every vCPU waits for the others
 * and raises an exception of its own (#UD, #GP, #PF, #DE by vCPU index):
 * the VMM must end the run with a message naming one of them.
 *
 * Arguments: ports=N (random port accesses per vCPU, default 20000),
 * mmio=N (random window accesses per vCPU, default 2000), notifies=N
 * (notifications per device, default 20000), each 0 to 10^9; bytes=SIZE
 * (memory churned, at most the free RAM outside the arena; default and 0:
 * all of it), passes=N (1 to 10^6, default 2), exceptions=0|1 (default 1),
 * seed=N.
 *
 * Output: `hostile vcpu=<i> ok ports=<n> mmio=<m> pages=<p>` per vCPU;
 * vCPU 0 adds `hostile devices=<d> attacks=<a> broken=<b> recovered=<r>`
 * where broken counts attacks after which the device asked for a reset
 * and recovered the disks that worked again after them. A disk that does
 * not recover, or a word of churned memory that reads back wrong, prints
 * `hostile: ...` and ends with status 1.
 */
#include "common.h"
#include "virtio.h"

#define ARENA_BYTES (4ull << 20)
/* The most ports=, mmio= and notifies= taken (ports * passes cannot wrap). */
#define MAX_COUNT   1000000000ull
#define QSIZE       16
#define SECTOR      512u
#define BLK_T_IN    0u
#define BLK_T_OUT   1u

static volatile uint32_t finished; /* vCPUs done with their attacks */

static uint64_t rng_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    return mix64(*s);
}

/* ---------------------------------------------------------------------- */
/* Raw accesses                                                            */
/* ---------------------------------------------------------------------- */

static int port_is_vmms(uint16_t port)
{
    return port == HVMM_PORT_CONSOLE || port == HVMM_PORT_EXIT || port == 0xf5;
}

static void random_port(uint64_t *rng)
{
    uint64_t r = rng_next(rng);
    uint16_t port = (uint16_t)r;
    if (port_is_vmms(port))
        return;
    uint32_t v = (uint32_t)(r >> 32);
    switch ((r >> 16) % 6) {
    case 0: __asm__ volatile("outb %b0, %w1" : : "a"(v), "d"(port)); break;
    case 1: __asm__ volatile("outw %w0, %w1" : : "a"(v), "d"(port)); break;
    case 2: __asm__ volatile("outl %0, %w1" : : "a"(v), "d"(port)); break;
    case 3: __asm__ volatile("inb %w1, %b0" : "=a"(v) : "d"(port)); break;
    case 4: __asm__ volatile("inw %w1, %w0" : "=a"(v) : "d"(port)); break;
    default: __asm__ volatile("inl %w1, %0" : "=a"(v) : "d"(port)); break;
    }
    (void)v;
}

/* One access of 1, 2, 4 or 8 bytes at addr, a read or a write of value. */
static void raw_access(uint64_t addr, unsigned size, int write, uint64_t value)
{
    switch (size | (write ? 16 : 0)) {
    case 1: { uint8_t v; __asm__ volatile("movb (%1), %0" : "=a"(v) : "d"(addr) : "memory"); (void)v; break; }
    case 2: { uint16_t v; __asm__ volatile("movw (%1), %0" : "=a"(v) : "d"(addr) : "memory"); (void)v; break; }
    case 4: { uint32_t v; __asm__ volatile("movl (%1), %0" : "=a"(v) : "d"(addr) : "memory"); (void)v; break; }
    case 8: { uint64_t v; __asm__ volatile("movq (%1), %0" : "=a"(v) : "d"(addr) : "memory"); (void)v; break; }
    case 17: __asm__ volatile("movb %b0, (%1)" : : "a"(value), "d"(addr) : "memory"); break;
    case 18: __asm__ volatile("movw %w0, (%1)" : : "a"(value), "d"(addr) : "memory"); break;
    case 20: __asm__ volatile("movl %k0, (%1)" : : "a"(value), "d"(addr) : "memory"); break;
    default: __asm__ volatile("movq %0, (%1)" : : "a"(value), "d"(addr) : "memory"); break;
    }
}

/* A random access somewhere in one of the windows: any size, any offset
 * the mapping covers (aligned to the size, as an unaligned access could
 * straddle the window's end), a random value. */
static void random_mmio(const struct hvmm_mmio *w, uint64_t n, uint64_t *rng)
{
    if (n == 0)
        return;
    uint64_t r = rng_next(rng);
    const struct hvmm_mmio *m = &w[mul_hi(r, n)];
    unsigned size = 1u << ((r >> 8) & 3);
    uint64_t off = mul_hi(rng_next(rng), m->size_bytes) & ~(uint64_t)(size - 1);
    raw_access(m->base + off, size, (r >> 12) & 1, rng_next(rng));
}

/* ---------------------------------------------------------------------- */
/* Devices                                                                 */
/* ---------------------------------------------------------------------- */

struct counts {
    unsigned attacks, broken, recovered;
};

static int needs_reset(const struct virtio_dev *d)
{
    return (virtio_status(d) & VIRTIO_STATUS_DEVICE_NEEDS_RESET) != 0;
}

/* Waits a bounded time for a used element or the device's give-up; 1 if
 * an element came back. */
static int settle(struct virtq *q)
{
    uint64_t start = hvmm_rdtsc();
    while (hvmm_rdtsc() - start < (1ull << 28)) {
        if (q->used->idx != q->last_used)
            return 1;
        if (needs_reset(q->dev))
            return 0;
        __asm__ volatile("pause");
    }
    return 0;
}

/* Brings the device up with queue 0 of QSIZE entries (and the other
 * queues, which the attacks leave alone); 0 on success. */
static int bring_up(struct virtio_dev *d, struct virtq *q,
                    struct virtio_arena *a)
{
    a->next = a->start;
    if (virtio_negotiate(d, 0) != 0 || virtq_setup(d, q, 0, QSIZE, a) != 0)
        return -1;
    return virtio_driver_ok(d);
}

/* Ends one attack: counts whether the device gave up, resets it. */
static void end_attack(struct virtio_dev *d, struct counts *c)
{
    c->attacks++;
    if (needs_reset(d))
        c->broken++;
    virtio_reset(d);
}

static void raw_desc(struct virtq *q, uint16_t i, uint64_t addr, uint32_t len,
                     uint16_t flags, uint16_t next)
{
    q->desc[i].addr = addr;
    q->desc[i].len = len;
    q->desc[i].flags = flags;
    q->desc[i].next = next;
}

/* Makes head available (without the SDK's free list) and notifies. */
static void raw_kick(struct virtq *q, uint16_t head, uint16_t advance)
{
    q->avail->ring[q->avail_idx & (q->size - 1)] = head;
    hvmm_barrier();
    q->avail_idx = (uint16_t)(q->avail_idx + advance);
    q->avail->idx = q->avail_idx;
    virtq_notify(q);
}

/* Rings at addresses the device must refuse at DRIVER_OK. */
static void attack_rings(struct virtio_dev *d, const struct hvmm_boot_info *info,
                         struct counts *c)
{
    uint64_t ram = info->ram_bytes;
    uint64_t end = ram <= (3ull << 30) ? ram : (1ull << 32) + ram - (3ull << 30);
    const uint64_t places[][3] = {
        { 0xc0000000ull, 0xc0001000ull, 0xc0002000ull }, /* the device hole */
        { end, end + 0x1000, end + 0x2000 },             /* past RAM */
        { ~0xfffull, ~0x1fffull, ~0x2fffull },           /* the top */
        { end - 0x80, end - 0x40, end - 0x20 },          /* straddling */
        { 0xd0000000ull, 0xd0000000ull, 0xd0000000ull }, /* the window */
    };
    for (unsigned p = 0; p < sizeof(places) / sizeof(places[0]); p++) {
        if (virtio_negotiate(d, 0) != 0)
            continue;
        virtio_write32(d, VIRTIO_MMIO_QUEUE_SEL, 0);
        virtio_write32(d, VIRTIO_MMIO_QUEUE_NUM, QSIZE);
        const uint32_t regs[3] = { VIRTIO_MMIO_QUEUE_DESC_LOW,
                                   VIRTIO_MMIO_QUEUE_DRIVER_LOW,
                                   VIRTIO_MMIO_QUEUE_DEVICE_LOW };
        for (unsigned r = 0; r < 3; r++) {
            virtio_write32(d, regs[r], (uint32_t)places[p][r]);
            virtio_write32(d, regs[r] + 4, (uint32_t)(places[p][r] >> 32));
        }
        virtio_write32(d, VIRTIO_MMIO_QUEUE_READY, 1);
        virtio_write32(d, VIRTIO_MMIO_STATUS,
                       virtio_status(d) | VIRTIO_STATUS_DRIVER_OK);
        virtio_write32(d, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        end_attack(d, c);
    }
    /* Queue sizes the device must refuse. */
    const uint32_t sizes[] = { 0, 3, 17, 0x8000, 0xffff, 0x10000 };
    for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        if (virtio_negotiate(d, 0) != 0)
            continue;
        virtio_write32(d, VIRTIO_MMIO_QUEUE_SEL, 0);
        virtio_write32(d, VIRTIO_MMIO_QUEUE_NUM, sizes[s]);
        virtio_write32(d, VIRTIO_MMIO_QUEUE_READY, 1);
        virtio_write32(d, VIRTIO_MMIO_STATUS,
                       virtio_status(d) | VIRTIO_STATUS_DRIVER_OK);
        virtio_write32(d, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        end_attack(d, c);
    }
}

/* Descriptor table and available ring in the VMM region (the GDT and the
 * IDT): the device reads them like any guest RAM and finds garbage. */
static void attack_vmm_region(struct virtio_dev *d, struct virtq *q,
                              struct virtio_arena *a, struct counts *c)
{
    if (bring_up(d, q, a) != 0)
        return;
    virtio_reset(d);
    if (virtio_negotiate(d, 0) != 0)
        return;
    virtio_write32(d, VIRTIO_MMIO_QUEUE_SEL, 0);
    virtio_write32(d, VIRTIO_MMIO_QUEUE_NUM, QSIZE);
    virtio_write32(d, VIRTIO_MMIO_QUEUE_DESC_LOW, 0x1000);
    virtio_write32(d, VIRTIO_MMIO_QUEUE_DESC_HIGH, 0);
    virtio_write32(d, VIRTIO_MMIO_QUEUE_DRIVER_LOW, 0x2000);
    virtio_write32(d, VIRTIO_MMIO_QUEUE_DRIVER_HIGH, 0);
    uint64_t used = (uintptr_t)q->used;
    virtio_write32(d, VIRTIO_MMIO_QUEUE_DEVICE_LOW, (uint32_t)used);
    virtio_write32(d, VIRTIO_MMIO_QUEUE_DEVICE_HIGH, (uint32_t)(used >> 32));
    virtio_write32(d, VIRTIO_MMIO_QUEUE_READY, 1);
    virtio_write32(d, VIRTIO_MMIO_STATUS,
                   virtio_status(d) | VIRTIO_STATUS_DRIVER_OK);
    virtio_write32(d, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
    end_attack(d, c);
}

/* Malformed chains on a working queue; `buf` is 4 KiB of scratch. */
static void attack_chains(struct virtio_dev *d, struct virtq *q,
                          struct virtio_arena *a, uint64_t ram_end,
                          uint8_t *buf, struct counts *c)
{
    for (unsigned kind = 0; kind < 11; kind++) {
        if (bring_up(d, q, a) != 0)
            return;
        uint64_t b = (uintptr_t)buf;
        uint16_t head = 0, advance = 1;
        switch (kind) {
        case 0: /* a loop of two */
            raw_desc(q, 0, b, 16, VIRTQ_DESC_F_NEXT, 1);
            raw_desc(q, 1, b + 16, 512, VIRTQ_DESC_F_NEXT | VIRTQ_DESC_F_WRITE, 0);
            break;
        case 1: /* a chain through every descriptor and back to the first */
            for (uint16_t i = 0; i < QSIZE; i++)
                raw_desc(q, i, b + 16 * i, 16, VIRTQ_DESC_F_NEXT,
                         (uint16_t)((i + 1) % QSIZE));
            break;
        case 2: { /* an indirect table longer than the queue */
            struct virtq_desc *t = (struct virtq_desc *)(buf + 1024);
            for (uint16_t i = 0; i < 64; i++)
                t[i] = (struct virtq_desc){ b, 8, VIRTQ_DESC_F_NEXT, (uint16_t)(i + 1) };
            t[63].flags = VIRTQ_DESC_F_WRITE;
            raw_desc(q, 0, (uintptr_t)t, 64 * 16, 4 /* INDIRECT */, 0);
            break;
        }
        case 3: { /* an indirect table naming itself */
            struct virtq_desc *t = (struct virtq_desc *)(buf + 1024);
            t[0] = (struct virtq_desc){ (uintptr_t)t, 16, 4, 0 };
            raw_desc(q, 0, (uintptr_t)t, 16, 4, 0);
            break;
        }
        case 4: /* a head past the table */
            head = 0xffff;
            break;
        case 5: /* next past the table */
            raw_desc(q, 0, b, 16, VIRTQ_DESC_F_NEXT, 0x7fff);
            break;
        case 6: /* buffers outside RAM */
            raw_desc(q, 0, ram_end + 0x1000, 16, VIRTQ_DESC_F_NEXT, 1);
            raw_desc(q, 1, 0xc0000000ull, 4096, VIRTQ_DESC_F_NEXT | VIRTQ_DESC_F_WRITE, 2);
            raw_desc(q, 2, ~0ull - 8, 1, VIRTQ_DESC_F_WRITE, 0);
            break;
        case 7: /* a 4 GiB buffer */
            raw_desc(q, 0, b, 16, VIRTQ_DESC_F_NEXT, 1);
            raw_desc(q, 1, b, 0xffffffffu, VIRTQ_DESC_F_WRITE, 0);
            break;
        case 8: /* the available index a thousand ahead */
            raw_desc(q, 0, b, 16, 0, 0);
            advance = 1000;
            break;
        case 9: /* readable after writable, no status byte */
            raw_desc(q, 0, b, 16, VIRTQ_DESC_F_NEXT | VIRTQ_DESC_F_WRITE, 1);
            raw_desc(q, 1, b + 16, 16, 0, 0);
            break;
        default: /* an indirect table outside RAM */
            raw_desc(q, 0, ram_end + 0x10000, 256, 4, 0);
            break;
        }
        raw_kick(q, head, advance);
        settle(q);
        end_attack(d, c);
    }
}

/* A request made available, then a reset before and after its
 * notification; then notifications at a high rate. */
static void attack_reset_and_notify(struct virtio_dev *d, struct virtq *q,
                                    struct virtio_arena *a, uint8_t *buf,
                                    uint64_t notifies, uint64_t *rng,
                                    struct counts *c)
{
    struct { uint32_t type, reserved; uint64_t sector; } *hdr = (void *)buf;
    if (bring_up(d, q, a) == 0) {
        hdr->type = BLK_T_IN;
        hdr->reserved = 0;
        hdr->sector = 0;
        struct virtio_buf bufs[3] = { { (uintptr_t)hdr, 16, 0 },
                                      { (uintptr_t)buf + 512, 2048, 1 },
                                      { (uintptr_t)buf + 4095, 1, 1 } };
        virtq_submit(q, bufs, 3);
        virtio_write32(d, VIRTIO_MMIO_STATUS, 0);
        virtq_notify(q); /* after the reset: the queue is gone */
        end_attack(d, c);
    }
    /* Notifications: valid queue, no new buffers; then random queues. */
    if (bring_up(d, q, a) == 0) {
        for (uint64_t i = 0; i < notifies; i++) {
            uint32_t which = (i & 1) ? 0 : (uint32_t)rng_next(rng);
            virtio_write32(d, VIRTIO_MMIO_QUEUE_NOTIFY, which);
        }
        end_attack(d, c);
    }
    /* Notifications on a broken device. */
    if (bring_up(d, q, a) == 0) {
        raw_kick(q, 0xffff, 1);
        for (uint64_t i = 0; i < notifies / 4; i++)
            virtio_write32(d, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        end_attack(d, c);
    }
}

/* Balloon: PFNs outside RAM and in the VMM region, free-page reports of
 * odd sizes, and a reset while the device holds the statistics buffer. */
static void attack_balloon(struct virtio_dev *d, struct virtio_arena *a,
                           uint64_t ram_end, uint8_t *buf, struct counts *c)
{
    struct virtq q[4];
    for (unsigned round = 0; round < 3; round++) {
        a->next = a->start;
        /* STATS_VQ (1) and REPORTING (5). */
        if (virtio_negotiate(d, (1ull << 1) | (1ull << 5)) != 0)
            return;
        unsigned n = 0;
        while (n < 4 && virtq_setup(d, &q[n], (uint16_t)n, QSIZE, a) == 0)
            n++;
        if (n == 0 || virtio_driver_ok(d) != 0) {
            end_attack(d, c);
            continue;
        }
        uint32_t *pfns = (uint32_t *)buf;
        struct virtio_buf one = { (uintptr_t)pfns, 0, 0 };
        if (round == 0) {
            /* Inflate the VMM region's pages, pages past RAM, 0xffffffff. */
            for (unsigned i = 0; i < 512; i++)
                pfns[i] = i;
            pfns[512] = (uint32_t)(ram_end >> 12);
            pfns[513] = 0xffffffffu;
            one.len = 514 * 4;
            if (virtq_submit(&q[0], &one, 1) >= 0) {
                virtq_notify(&q[0]);
                settle(&q[0]);
            }
            /* Deflate pages never inflated. */
            if (n > 1 && virtq_submit(&q[1], &one, 1) >= 0) {
                virtq_notify(&q[1]);
                settle(&q[1]);
            }
        } else if (round == 1) {
            /* Free-page reports over the VMM region, past RAM, and of 4 GiB;
             * the last queue set up is the reporting one. */
            struct virtq *r = &q[n - 1];
            struct virtio_buf rep[3] = { { 0, 2u << 20, 1 },
                                         { ram_end, 2u << 20, 1 },
                                         { 4ull << 20, 0xfffff000u, 1 } };
            for (unsigned i = 0; i < 3; i++) {
                if (virtq_submit(r, &rep[i], 1) >= 0) {
                    virtq_notify(r);
                    settle(r);
                }
            }
        } else if (n >= 3) {
            /* The statistics buffer is held by the device: reset under it. */
            struct virtio_buf st = { (uintptr_t)buf, 30, 0 };
            if (virtq_submit(&q[2], &st, 1) >= 0)
                virtq_notify(&q[2]);
        }
        end_attack(d, c);
    }
}

/* The disk works after all that: write a sector, read it back. */
static int disk_recovers(struct virtio_dev *d, struct virtq *q,
                         struct virtio_arena *a, uint8_t *buf, uint64_t seed)
{
    if (bring_up(d, q, a) != 0)
        return -1;
    struct { uint32_t type, reserved; uint64_t sector; } *hdr = (void *)buf;
    uint8_t *data = buf + 512, *status = buf + 2048;
    for (int pass = 0; pass < 2; pass++) {
        hdr->type = pass == 0 ? BLK_T_OUT : BLK_T_IN;
        hdr->reserved = 0;
        hdr->sector = 1;
        for (unsigned i = 0; i < SECTOR; i++)
            data[i] = pass == 0 ? (uint8_t)(mix64(seed + i)) : 0;
        *status = 0xff;
        struct virtio_buf bufs[3] = { { (uintptr_t)hdr, 16, 0 },
                                      { (uintptr_t)data, SECTOR, pass != 0 },
                                      { (uintptr_t)status, 1, 1 } };
        uint32_t len;
        if (virtq_transfer(q, bufs, 3, &len) != 0 || *status != 0) {
            hvmm_printf("hostile: the disk does not work after the attacks "
                        "(pass %d, status %u)\n",
                        pass, *status);
            return -1;
        }
    }
    for (unsigned i = 0; i < SECTOR; i++) {
        if (data[i] != (uint8_t)mix64(seed + i)) {
            hvmm_printf("hostile: the disk read back wrong data at byte %u\n", i);
            return -1;
        }
    }
    virtio_reset(d);
    return 0;
}

static int attack_devices(const struct hvmm_boot_info *info,
                          struct virtio_arena *a, uint64_t notifies,
                          uint64_t *rng)
{
    uint64_t count;
    const struct hvmm_mmio *w = hvmm_mmio_devices(info, &count);
    uint64_t ram = info->ram_bytes;
    uint64_t ram_end = ram <= (3ull << 30) ? ram : (1ull << 32) + ram - (3ull << 30);
    struct counts c = { 0, 0, 0 };
    unsigned devices = 0, disks = 0;
    int status = 0;
    for (uint64_t i = 0; i < count; i++) {
        struct virtio_dev d;
        struct virtq q;
        if (virtio_probe(&d, w[i].base, w[i].irq) != 0)
            continue;
        devices++;
        /* Scratch for chains, outside the rings' part of the arena. */
        uint8_t *buf = (uint8_t *)(uintptr_t)(a->end - 8192);
        for (unsigned k = 0; k < 4096; k++) {
            unsigned size = 1u << (rng_next(rng) & 3);
            uint64_t off = (rng_next(rng) & 0xfff) & ~(uint64_t)(size - 1);
            raw_access(w[i].base + off, size, (int)(k & 1), rng_next(rng));
        }
        virtio_reset(&d);
        attack_rings(&d, info, &c);
        attack_vmm_region(&d, &q, a, &c);
        if (d.device_id == VIRTIO_ID_BLOCK) {
            attack_chains(&d, &q, a, ram_end, buf, &c);
            attack_reset_and_notify(&d, &q, a, buf, notifies, rng, &c);
            disks++;
            if (disk_recovers(&d, &q, a, buf, rng_next(rng)) == 0)
                c.recovered++;
            else
                status = 1;
        } else if (d.device_id == VIRTIO_ID_BALLOON) {
            attack_balloon(&d, a, ram_end, buf, &c);
        }
    }
    hvmm_printf("hostile devices=%u attacks=%u broken=%u recovered=%u\n",
                devices, c.attacks, c.broken, c.recovered);
    return status;
}

/* ---------------------------------------------------------------------- */
/* Memory churn and the end                                                */
/* ---------------------------------------------------------------------- */

static int churn(const struct hvmm_boot_info *info, struct share s,
                 uint64_t pass, unsigned vcpu, uint64_t *pages)
{
    struct hvmm_free_iter it;
    uint64_t addr, n;
    hvmm_free_iter_init(&it, info, s.off, s.len);
    while (hvmm_free_iter_next(&it, &addr, &n)) {
        for (uint64_t p = (addr + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1);
             p + 8 <= addr + n; p += PAGE_SIZE) {
            volatile uint64_t *word = (volatile uint64_t *)(uintptr_t)p;
            uint64_t want = mix64(p) ^ (pass - 1);
            if (pass > 0 && *word != want) {
                hvmm_printf("hostile: vcpu %u: word at 0x%lx is 0x%lx, "
                            "expected 0x%lx\n",
                            vcpu, p, *word, want);
                return -1;
            }
            *word = mix64(p) ^ pass;
            (*pages)++;
        }
    }
    return 0;
}

__attribute__((noreturn)) static void raise_exception(unsigned vcpu)
{
    switch (vcpu % 4) {
    case 0: __asm__ volatile("ud2"); break;
    case 1: __asm__ volatile("mov %%cr0, %%rax" : : : "rax"); break;
    case 2: (void)*(volatile uint64_t *)0xc0000000ull; break;
    default: {
        /* In assembly: gcc turns 1 / x into x == 1, which cannot trap. */
        uint64_t lo = 1, hi = 0, zero = 0;
        __asm__ volatile("divq %2" : "+a"(lo), "+d"(hi) : "r"(zero));
        break;
    }
    }
    hvmm_printf("hostile: vcpu %u: the exception did not happen\n", vcpu);
    hvmm_exit(1);
}

int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info)
{
    uint64_t ports = 20000, mmio = 2000, notifies = 20000, bytes = 0;
    uint64_t passes = 2, exceptions = 1, seed = 1;
    /* The working set leaves the virtio arena alone (bytes=0: all the rest). */
    uint64_t free_bytes = hvmm_free_bytes(info);
    uint64_t usable = free_bytes > ARENA_BYTES ? free_bytes - ARENA_BYTES : 0;
    const struct hvmm_arg_spec specs[] = {
        { "ports", HVMM_ARG_NUMBER, &ports, HVMM_ARG_RANGE(0, MAX_COUNT) },
        { "mmio", HVMM_ARG_NUMBER, &mmio, HVMM_ARG_RANGE(0, MAX_COUNT) },
        { "notifies", HVMM_ARG_NUMBER, &notifies, HVMM_ARG_RANGE(0, MAX_COUNT) },
        { "bytes", HVMM_ARG_SIZE, &bytes, HVMM_ARG_RANGE(0, usable) },
        { "passes", HVMM_ARG_NUMBER, &passes, HVMM_ARG_RANGE(1, MAX_PASSES) },
        { "exceptions", HVMM_ARG_NUMBER, &exceptions, HVMM_ARG_RANGE(0, 1) },
        { "seed", HVMM_ARG_NUMBER, &seed, HVMM_ARG_ANY },
        HVMM_ARG_END,
    };
    if (hvmm_parse_args(info, "hostile", specs, vcpu == 0) != 0)
        return 2;
    unsigned n = vcpu_count(info);
    uint64_t rng = mix64(seed * 0x100000001b3ull + vcpu);

    /* Every vCPU computes the same arena, the top of the highest range;
     * only vCPU 0 uses it, the rest keep their churn below it. */
    struct virtio_arena arena;
    if (virtio_arena_init(&arena, info, vcpu == 0 ? ARENA_BYTES : 0) == 0 &&
        vcpu == 0) {
        hvmm_printf("hostile: no room for the virtio arena\n");
        return 2;
    }
    if (bytes == 0)
        bytes = usable;
    bytes &= ~7ull;
    uint64_t count;
    const struct hvmm_mmio *windows = hvmm_mmio_devices(info, &count);

    int status = 0;
    uint64_t pages = 0, did_ports = 0, did_mmio = 0;
    if (vcpu == 0) {
        status = attack_devices(info, &arena, notifies, &rng);
        for (; did_ports < ports; did_ports++)
            random_port(&rng);
    } else {
        struct share s = vcpu_share(bytes, n - 1, vcpu - 1);
        for (uint64_t pass = 0; pass < passes && status == 0; pass++) {
            status = churn(info, s, pass, vcpu, &pages);
            uint64_t p_end = ports * (pass + 1) / passes;
            uint64_t m_end = mmio * (pass + 1) / passes;
            for (; did_ports < p_end; did_ports++)
                random_port(&rng);
            for (; did_mmio < m_end; did_mmio++)
                random_mmio(windows, count, &rng);
        }
    }
    hvmm_printf("hostile vcpu=%u %s ports=%lu mmio=%lu pages=%lu\n", vcpu,
                status == 0 ? "ok" : "FAILED", did_ports, did_mmio, pages);
    if (status != 0 || !exceptions)
        return status;
    __atomic_add_fetch(&finished, 1, __ATOMIC_SEQ_CST);
    for (uint64_t start = hvmm_rdtsc(); finished < n;) {
        if (hvmm_rdtsc() - start > (1ull << 36))
            break;
        __asm__ volatile("pause");
    }
    raise_exception(vcpu);
}
