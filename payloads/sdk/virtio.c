/*
 * virtio.c - the polling virtio-mmio driver of the payload SDK (virtio.h).
 *
 * Written from the virtio 1.x specification: device initialization (3.1),
 * the virtio-mmio transport version 2 (4.2) and split virtqueues (2.7).
 * No global state: every vCPU may run this code at once on its own
 * structures.
 */
#include "virtio.h"

#define ARENA_PAGE 4096ull

/* ---------------------------------------------------------------------- */
/* Arena                                                                   */
/* ---------------------------------------------------------------------- */

uint64_t virtio_arena_init(struct virtio_arena *a,
                           const struct hvmm_boot_info *info, uint64_t bytes)
{
    a->start = a->end = a->next = 0;
    if (bytes == 0 || bytes > UINT64_MAX - ARENA_PAGE)
        return 0;
    bytes = (bytes + ARENA_PAGE - 1) & ~(ARENA_PAGE - 1);
    for (uint64_t i = info->range_count; i-- > 0;) {
        const struct hvmm_range *r = &info->ranges[i];
        uint64_t end = r->end & ~(ARENA_PAGE - 1);
        if (end <= r->start || end - r->start < bytes)
            continue;
        a->start = a->next = end - bytes;
        a->end = end;
        memset((void *)(uintptr_t)a->start, 0, bytes);
        return a->start;
    }
    return 0;
}

void *virtio_arena_alloc(struct virtio_arena *a, uint64_t bytes,
                         uint64_t align)
{
    if (align == 0)
        align = 1;
    uint64_t at = (a->next + align - 1) & ~(align - 1);
    if (at < a->next || at > a->end || a->end - at < bytes)
        return NULL;
    a->next = at + bytes;
    void *p = (void *)(uintptr_t)at;
    memset(p, 0, bytes);
    return p;
}

/* ---------------------------------------------------------------------- */
/* Device                                                                  */
/* ---------------------------------------------------------------------- */

int virtio_probe(struct virtio_dev *d, uint64_t base, uint32_t irq)
{
    d->base = base;
    d->irq = irq;
    d->device_id = 0;
    d->offered = d->features = 0;
    if (virtio_read32(d, VIRTIO_MMIO_MAGIC_VALUE) != VIRTIO_MMIO_MAGIC)
        return -1;
    if (virtio_read32(d, VIRTIO_MMIO_VERSION) != 2)
        return -1; /* legacy (1) or unknown */
    d->device_id = virtio_read32(d, VIRTIO_MMIO_DEVICE_ID);
    return d->device_id != 0 ? 0 : -1; /* 0: a placeholder, no device */
}

int virtio_find(const struct hvmm_boot_info *info, uint32_t device_id,
                unsigned nth, struct virtio_dev *d)
{
    uint64_t count;
    const struct hvmm_mmio *mmio = hvmm_mmio_devices(info, &count);
    for (uint64_t i = 0; i < count; i++) {
        if (mmio[i].size_bytes < VIRTIO_MMIO_CONFIG)
            continue;
        if (virtio_probe(d, mmio[i].base, mmio[i].irq) != 0 ||
            d->device_id != device_id)
            continue;
        if (nth-- == 0)
            return 0;
    }
    return -1;
}

uint32_t virtio_status(const struct virtio_dev *d)
{
    return virtio_read32(d, VIRTIO_MMIO_STATUS);
}

/* Adds status bits (the driver only ever adds, or resets). */
static void add_status(struct virtio_dev *d, uint32_t bits)
{
    virtio_write32(d, VIRTIO_MMIO_STATUS, virtio_status(d) | bits);
}

void virtio_reset(struct virtio_dev *d)
{
    virtio_write32(d, VIRTIO_MMIO_STATUS, 0);
    /* 4.2.3.1: the reset is complete when Status reads 0. */
    for (uint64_t start = hvmm_rdtsc(); virtio_status(d) != 0;) {
        if (hvmm_rdtsc() - start > VIRTIO_WAIT_CYCLES)
            break;
        __asm__ volatile("pause");
    }
}

void virtio_fail(struct virtio_dev *d)
{
    add_status(d, VIRTIO_STATUS_FAILED);
}

static uint64_t read_device_features(const struct virtio_dev *d)
{
    virtio_write32(d, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
    uint64_t lo = virtio_read32(d, VIRTIO_MMIO_DEVICE_FEATURES);
    virtio_write32(d, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
    uint64_t hi = virtio_read32(d, VIRTIO_MMIO_DEVICE_FEATURES);
    return (hi << 32) | lo;
}

static void write_driver_features(const struct virtio_dev *d, uint64_t f)
{
    virtio_write32(d, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
    virtio_write32(d, VIRTIO_MMIO_DRIVER_FEATURES, (uint32_t)f);
    virtio_write32(d, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
    virtio_write32(d, VIRTIO_MMIO_DRIVER_FEATURES, (uint32_t)(f >> 32));
}

int virtio_negotiate(struct virtio_dev *d, uint64_t wanted)
{
    virtio_reset(d);
    if (virtio_status(d) != 0) {
        hvmm_printf("virtio: device %u at 0x%lx: reset did not complete\n",
                    d->device_id, d->base);
        return -1;
    }
    add_status(d, VIRTIO_STATUS_ACKNOWLEDGE);
    add_status(d, VIRTIO_STATUS_DRIVER);
    d->offered = read_device_features(d);
    const uint64_t version_1 = 1ull << VIRTIO_F_VERSION_1;
    if (!(d->offered & version_1)) {
        hvmm_printf("virtio: device %u at 0x%lx does not offer VERSION_1 "
                    "(features 0x%lx)\n",
                    d->device_id, d->base, d->offered);
        virtio_fail(d);
        return -1;
    }
    d->features = (wanted | version_1) & d->offered;
    write_driver_features(d, d->features);
    add_status(d, VIRTIO_STATUS_FEATURES_OK);
    if (!(virtio_status(d) & VIRTIO_STATUS_FEATURES_OK)) {
        hvmm_printf("virtio: device %u at 0x%lx refused features 0x%lx\n",
                    d->device_id, d->base, d->features);
        virtio_fail(d);
        return -1;
    }
    return 0;
}

int virtio_driver_ok(struct virtio_dev *d)
{
    add_status(d, VIRTIO_STATUS_DRIVER_OK);
    uint32_t status = virtio_status(d);
    if (!(status & VIRTIO_STATUS_DRIVER_OK) ||
        (status & VIRTIO_STATUS_DEVICE_NEEDS_RESET)) {
        hvmm_printf("virtio: device %u at 0x%lx did not start (status "
                    "0x%x)\n",
                    d->device_id, d->base, status);
        virtio_fail(d);
        return -1;
    }
    return 0;
}

uint32_t virtio_config_read32(const struct virtio_dev *d, uint32_t offset)
{
    return virtio_read32(d, VIRTIO_MMIO_CONFIG + offset);
}

void virtio_config_write32(const struct virtio_dev *d, uint32_t offset,
                           uint32_t v)
{
    virtio_write32(d, VIRTIO_MMIO_CONFIG + offset, v);
}

uint64_t virtio_config_read64(const struct virtio_dev *d, uint32_t offset)
{
    for (;;) {
        uint32_t gen = virtio_read32(d, VIRTIO_MMIO_CONFIG_GENERATION);
        uint64_t lo = virtio_config_read32(d, offset);
        uint64_t hi = virtio_config_read32(d, offset + 4);
        if (virtio_read32(d, VIRTIO_MMIO_CONFIG_GENERATION) == gen)
            return (hi << 32) | lo;
    }
}

/* ---------------------------------------------------------------------- */
/* Virtqueues                                                              */
/* ---------------------------------------------------------------------- */

static uint64_t round_page(uint64_t n)
{
    return (n + ARENA_PAGE - 1) & ~(ARENA_PAGE - 1);
}

int virtq_setup(struct virtio_dev *d, struct virtq *q, uint16_t index,
                uint16_t size, struct virtio_arena *a)
{
    memset(q, 0, sizeof(*q));
    virtio_write32(d, VIRTIO_MMIO_QUEUE_SEL, index);
    if (virtio_read32(d, VIRTIO_MMIO_QUEUE_READY) != 0) {
        hvmm_printf("virtio: device %u queue %u is already in use\n",
                    d->device_id, index);
        return -1;
    }
    uint32_t max = virtio_read32(d, VIRTIO_MMIO_QUEUE_NUM_MAX);
    if (max == 0) {
        hvmm_printf("virtio: device %u has no queue %u\n", d->device_id,
                    index);
        return -1;
    }
    uint32_t n = size == 0 || size > max ? max : size;
    if (n > 32768)
        n = 32768;
    while (n & (n - 1))
        n &= n - 1; /* round down to a power of two */

    void *desc = virtio_arena_alloc(a, round_page(16ull * n), ARENA_PAGE);
    void *avail = virtio_arena_alloc(a, round_page(6 + 2ull * n), ARENA_PAGE);
    void *used = virtio_arena_alloc(a, round_page(6 + 8ull * n), ARENA_PAGE);
    if (desc == NULL || avail == NULL || used == NULL) {
        hvmm_printf("virtio: device %u queue %u: no room for %u entries in "
                    "the arena [0x%lx, 0x%lx)\n",
                    d->device_id, index, n, a->start, a->end);
        return -1;
    }
    q->dev = d;
    q->desc = desc;
    q->avail = avail;
    q->used = used;
    q->index = index;
    q->size = (uint16_t)n;
    for (uint32_t i = 0; i < n; i++)
        q->desc[i].next = (uint16_t)(i + 1 < n ? i + 1 : 0);
    q->free_head = 0;
    q->num_free = (uint16_t)n;
    q->avail->flags = VIRTQ_AVAIL_F_NO_INTERRUPT;

    virtio_write32(d, VIRTIO_MMIO_QUEUE_NUM, n);
    uint64_t da = (uintptr_t)desc, aa = (uintptr_t)avail, ua = (uintptr_t)used;
    virtio_write32(d, VIRTIO_MMIO_QUEUE_DESC_LOW, (uint32_t)da);
    virtio_write32(d, VIRTIO_MMIO_QUEUE_DESC_HIGH, (uint32_t)(da >> 32));
    virtio_write32(d, VIRTIO_MMIO_QUEUE_DRIVER_LOW, (uint32_t)aa);
    virtio_write32(d, VIRTIO_MMIO_QUEUE_DRIVER_HIGH, (uint32_t)(aa >> 32));
    virtio_write32(d, VIRTIO_MMIO_QUEUE_DEVICE_LOW, (uint32_t)ua);
    virtio_write32(d, VIRTIO_MMIO_QUEUE_DEVICE_HIGH, (uint32_t)(ua >> 32));
    virtio_mb();
    virtio_write32(d, VIRTIO_MMIO_QUEUE_READY, 1);
    if (virtio_read32(d, VIRTIO_MMIO_QUEUE_READY) != 1) {
        hvmm_printf("virtio: device %u queue %u did not become ready\n",
                    d->device_id, index);
        return -1;
    }
    return 0;
}

int virtq_submit(struct virtq *q, const struct virtio_buf *bufs, unsigned n)
{
    if (n == 0 || n > q->num_free)
        return -1;
    uint16_t head = q->free_head, i = head;
    for (unsigned k = 0; k < n; k++) {
        volatile struct virtq_desc *d = &q->desc[i];
        d->addr = bufs[k].addr;
        d->len = bufs[k].len;
        uint16_t flags = bufs[k].device_writes ? VIRTQ_DESC_F_WRITE : 0;
        if (k + 1 < n) {
            flags |= VIRTQ_DESC_F_NEXT;
            d->flags = flags;
            i = d->next; /* the free list's link becomes the chain's */
        } else {
            d->flags = flags;
            q->free_head = d->next;
        }
    }
    q->num_free = (uint16_t)(q->num_free - n);

    q->avail->ring[q->avail_idx & (q->size - 1)] = head;
    /* The descriptors and the ring entry before the index (2.7.13). x86
     * keeps stores in order; the barrier keeps the compiler from moving
     * them. */
    hvmm_barrier();
    q->avail_idx++;
    q->avail->idx = q->avail_idx;
    return head;
}

void virtq_notify(struct virtq *q)
{
    /* The new avail->idx must be visible before the device looks. */
    virtio_mb();
    virtio_write32(q->dev, VIRTIO_MMIO_QUEUE_NOTIFY, q->index);
}

int virtq_poll(struct virtq *q, uint32_t *head, uint32_t *len)
{
    if (q->used->idx == q->last_used)
        return 0;
    /* Read the element only after seeing the index that covers it. */
    hvmm_barrier();
    volatile struct virtq_used_elem *e = &q->used->ring[q->last_used & (q->size - 1)];
    uint32_t id = e->id, n = e->len;
    q->last_used++;
    *head = id;
    *len = n;
    if (id >= q->size)
        return 1; /* a bogus id: nothing to free (the caller sees it) */

    /* Put the chain back on the free list. */
    uint16_t last = (uint16_t)id, count = 1;
    while ((q->desc[last].flags & VIRTQ_DESC_F_NEXT) && count < q->size) {
        last = q->desc[last].next;
        count++;
    }
    q->desc[last].next = q->free_head;
    q->free_head = (uint16_t)id;
    q->num_free = (uint16_t)(q->num_free + count);
    return 1;
}

int virtq_wait(struct virtq *q, uint32_t *head, uint32_t *len)
{
    uint64_t start = hvmm_rdtsc();
    for (uint64_t spins = 0;; spins++) {
        if (virtq_poll(q, head, len))
            return 0;
        if ((spins & 1023) == 1023) {
            uint32_t status = virtio_status(q->dev);
            if (status & VIRTIO_STATUS_DEVICE_NEEDS_RESET) {
                hvmm_printf("virtio: device %u needs a reset (status 0x%x) "
                            "while queue %u waits\n",
                            q->dev->device_id, status, q->index);
                return -1;
            }
            if (hvmm_rdtsc() - start > VIRTIO_WAIT_CYCLES) {
                hvmm_printf("virtio: device %u queue %u: nothing came back "
                            "(avail %u, used %u)\n",
                            q->dev->device_id, q->index, q->avail_idx,
                            q->used->idx);
                return -1;
            }
        }
        __asm__ volatile("pause");
    }
}

int virtq_transfer(struct virtq *q, const struct virtio_buf *bufs, unsigned n,
                   uint32_t *len)
{
    int head = virtq_submit(q, bufs, n);
    if (head < 0) {
        hvmm_printf("virtio: device %u queue %u: no room for %u "
                    "descriptors\n",
                    q->dev->device_id, q->index, n);
        return -1;
    }
    virtq_notify(q);
    uint32_t got;
    if (virtq_wait(q, &got, len) != 0)
        return -1;
    if (got != (uint32_t)head) {
        hvmm_printf("virtio: device %u queue %u returned chain %u, expected "
                    "%d\n",
                    q->dev->device_id, q->index, got, head);
        return -1;
    }
    return 0;
}
