/*
 * virtio.h - a small polling virtio-mmio driver for payloads (protocol
 * version 2).
 *
 * Devices are virtio 1.x "modern" virtio-mmio (Version register 2) with
 * split virtqueues. Interrupts are off at CPL 3, so the driver polls the
 * used rings. It keeps no global state: the caller owns every structure
 * (keep them on the stack, or let a single vCPU drive a device).
 *
 * Typical use (blkcheck.c and balloon.c are complete examples):
 *
 *     struct virtio_arena arena;
 *     struct virtio_dev dev;
 *     struct virtq q;
 *     if (virtio_arena_init(&arena, info, 1 << 20) == 0) ...  // no room
 *     if (virtio_find(info, VIRTIO_ID_BLOCK, 0, &dev) != 0) ... // no device
 *     if (virtio_negotiate(&dev, wanted_features) != 0) ...
 *     if (virtq_setup(&dev, &q, 0, 16, &arena) != 0) ...
 *     if (virtio_driver_ok(&dev) != 0) ...
 *     struct virtio_buf bufs[] = {
 *         { header_addr, 16, 0 },            // device reads
 *         { data_addr, 4096, 1 },            // device writes
 *         { status_addr, 1, 1 },
 *     };
 *     uint32_t used_len;
 *     if (virtq_transfer(&q, bufs, 3, &used_len) != 0) ...
 *
 * Memory. Rings and request buffers must lie in free RAM the payload owns.
 * virtio_arena_init carves a block off the TOP of the highest free range
 * that holds it, so payloads that work from the bottom of the free space
 * do not collide with it; virtio_arena_alloc hands out zeroed, aligned
 * pieces of that block. A payload that uses all free RAM must leave the
 * arena's [start, end) alone.
 *
 * Register access. Every register access is one aligned 32-bit load or
 * store (the transport ignores other sizes), done in inline assembly
 * (movl (%rdx), %eax / movl %eax, (%rdx)) so that the compiler can neither
 * split nor merge it; the configuration space is read 32 bits at a time
 * too.
 */
#ifndef HVMM_VIRTIO_H
#define HVMM_VIRTIO_H

#include "hvmm.h"

/* ---------------------------------------------------------------------- */
/* Constants from the virtio 1.x specification                             */
/* ---------------------------------------------------------------------- */

/* virtio-mmio registers (offsets in the device window). */
#define VIRTIO_MMIO_MAGIC_VALUE         0x000 /* "virt" */
#define VIRTIO_MMIO_VERSION             0x004 /* 2 for virtio 1.x */
#define VIRTIO_MMIO_DEVICE_ID           0x008
#define VIRTIO_MMIO_VENDOR_ID           0x00c
#define VIRTIO_MMIO_DEVICE_FEATURES     0x010
#define VIRTIO_MMIO_DEVICE_FEATURES_SEL 0x014
#define VIRTIO_MMIO_DRIVER_FEATURES     0x020
#define VIRTIO_MMIO_DRIVER_FEATURES_SEL 0x024
#define VIRTIO_MMIO_QUEUE_SEL           0x030
#define VIRTIO_MMIO_QUEUE_NUM_MAX       0x034
#define VIRTIO_MMIO_QUEUE_NUM           0x038
#define VIRTIO_MMIO_QUEUE_READY         0x044
#define VIRTIO_MMIO_QUEUE_NOTIFY        0x050
#define VIRTIO_MMIO_INTERRUPT_STATUS    0x060
#define VIRTIO_MMIO_INTERRUPT_ACK       0x064
#define VIRTIO_MMIO_STATUS              0x070
#define VIRTIO_MMIO_QUEUE_DESC_LOW      0x080
#define VIRTIO_MMIO_QUEUE_DESC_HIGH     0x084
#define VIRTIO_MMIO_QUEUE_DRIVER_LOW    0x090 /* the available ring */
#define VIRTIO_MMIO_QUEUE_DRIVER_HIGH   0x094
#define VIRTIO_MMIO_QUEUE_DEVICE_LOW    0x0a0 /* the used ring */
#define VIRTIO_MMIO_QUEUE_DEVICE_HIGH   0x0a4
#define VIRTIO_MMIO_CONFIG_GENERATION   0x0fc
#define VIRTIO_MMIO_CONFIG              0x100 /* device configuration space */

#define VIRTIO_MMIO_MAGIC 0x74726976u /* "virt", little-endian */

/* Device status bits. */
#define VIRTIO_STATUS_ACKNOWLEDGE        1u
#define VIRTIO_STATUS_DRIVER             2u
#define VIRTIO_STATUS_DRIVER_OK          4u
#define VIRTIO_STATUS_FEATURES_OK        8u
#define VIRTIO_STATUS_DEVICE_NEEDS_RESET 64u
#define VIRTIO_STATUS_FAILED             128u

/* Device-independent feature bits. */
#define VIRTIO_F_VERSION_1 32

/* Device IDs. */
#define VIRTIO_ID_BLOCK   2u
#define VIRTIO_ID_BALLOON 5u

/* ---------------------------------------------------------------------- */
/* Split virtqueue layout                                                  */
/* ---------------------------------------------------------------------- */

#define VIRTQ_DESC_F_NEXT  1 /* the chain continues in `next` */
#define VIRTQ_DESC_F_WRITE 2 /* device-writable (else device-readable) */

#define VIRTQ_AVAIL_F_NO_INTERRUPT 1 /* the driver polls */

struct virtq_desc {
    uint64_t addr;
    uint32_t len;
    uint16_t flags;
    uint16_t next;
};

struct virtq_avail {
    uint16_t flags;
    uint16_t idx;
    uint16_t ring[]; /* size entries, then uint16_t used_event */
};

struct virtq_used_elem {
    uint32_t id; /* head of the chain */
    uint32_t len; /* bytes the device wrote into the chain */
};

struct virtq_used {
    uint16_t flags;
    uint16_t idx;
    struct virtq_used_elem ring[]; /* size entries, then uint16_t avail_event */
};

_Static_assert(sizeof(struct virtq_desc) == 16, "layout");
_Static_assert(sizeof(struct virtq_used_elem) == 8, "layout");

/* ---------------------------------------------------------------------- */
/* Memory for rings and buffers                                            */
/* ---------------------------------------------------------------------- */

/* A block of free RAM handed out upwards by virtio_arena_alloc. */
struct virtio_arena {
    uint64_t start; /* the block: [start, end) */
    uint64_t end;
    uint64_t next;  /* first byte not handed out yet */
};

/*
 * Takes `bytes` (rounded up to 4 KiB) from the top of the highest free
 * range that holds them: the arena is [range end - bytes, range end).
 * Returns the arena's start, or 0 (and an empty arena) if no free range is
 * large enough. Free RAM reads as zero at entry, and the arena is zeroed
 * again here.
 */
uint64_t virtio_arena_init(struct virtio_arena *a,
                           const struct hvmm_boot_info *info, uint64_t bytes);

/* `bytes` of the arena at a multiple of `align` (a power of two), zeroed;
 * NULL when the arena is exhausted. */
void *virtio_arena_alloc(struct virtio_arena *a, uint64_t bytes,
                         uint64_t align);

/* ---------------------------------------------------------------------- */
/* Devices                                                                 */
/* ---------------------------------------------------------------------- */

struct virtio_dev {
    uint64_t base;       /* MMIO window (identity-mapped) */
    uint32_t device_id;  /* DeviceID register */
    uint32_t irq;        /* from the boot info (unused: we poll) */
    uint64_t offered;    /* features the device offers (after negotiate) */
    uint64_t features;   /* features both sides accepted */
};

/* One aligned 32-bit MMIO access. The fixed registers (address in rdx,
 * value in eax) keep the instructions simple for the host test harness,
 * which emulates them. */
static inline uint32_t virtio_mmio_read32(uint64_t addr)
{
    uint32_t v;
    __asm__ volatile("movl (%1), %0" : "=a"(v) : "d"(addr) : "memory");
    return v;
}

static inline void virtio_mmio_write32(uint64_t addr, uint32_t v)
{
    __asm__ volatile("movl %0, (%1)" : : "a"(v), "d"(addr) : "memory");
}

/* Full barrier (CPU and compiler), e.g. between publishing a ring index
 * and notifying the device. */
static inline void virtio_mb(void)
{
    __asm__ volatile("mfence" : : : "memory");
}

static inline uint32_t virtio_read32(const struct virtio_dev *d, uint32_t reg)
{
    return virtio_mmio_read32(d->base + reg);
}

static inline void virtio_write32(const struct virtio_dev *d, uint32_t reg,
                                  uint32_t v)
{
    virtio_mmio_write32(d->base + reg, v);
}

/*
 * Checks the window at `base` (magic "virt", Version 2) and reads its
 * DeviceID into d. Returns 0, or -1 (and prints nothing) if it is not a
 * virtio 1.x mmio device.
 */
int virtio_probe(struct virtio_dev *d, uint64_t base, uint32_t irq);

/*
 * Finds the nth (0-based) virtio-mmio device of the boot info with DeviceID
 * `device_id` and probes it into d. Returns 0, or -1 when there is none
 * (always for version-1 boot info).
 */
int virtio_find(const struct hvmm_boot_info *info, uint32_t device_id,
                unsigned nth, struct virtio_dev *d);

/* Writes 0 to Status and waits until it reads back 0. */
void virtio_reset(struct virtio_dev *d);

/*
 * Resets the device, sets ACKNOWLEDGE and DRIVER, accepts the features in
 * `wanted` the device offers plus VIRTIO_F_VERSION_1 (which the device
 * must offer), sets FEATURES_OK and checks that it stuck. The result is in
 * d->offered and d->features. Returns 0, or -1 with a message and the
 * FAILED status bit set.
 */
int virtio_negotiate(struct virtio_dev *d, uint64_t wanted);

/* Sets DRIVER_OK; returns 0, or -1 with a message if the device did not
 * take it or needs a reset. */
int virtio_driver_ok(struct virtio_dev *d);

/* Sets the FAILED status bit: the driver gives up on the device. */
void virtio_fail(struct virtio_dev *d);

/* The Status register. */
uint32_t virtio_status(const struct virtio_dev *d);

/* Device configuration space, 32-bit aligned `offset` (from 0x100). */
uint32_t virtio_config_read32(const struct virtio_dev *d, uint32_t offset);
void virtio_config_write32(const struct virtio_dev *d, uint32_t offset,
                           uint32_t v);
/* A 64-bit field as two 32-bit reads, retried until ConfigGeneration is
 * the same before and after. */
uint64_t virtio_config_read64(const struct virtio_dev *d, uint32_t offset);

/* ---------------------------------------------------------------------- */
/* Virtqueues                                                              */
/* ---------------------------------------------------------------------- */

struct virtq {
    struct virtio_dev *dev;
    volatile struct virtq_desc *desc;
    volatile struct virtq_avail *avail;
    volatile struct virtq_used *used;
    uint16_t index;     /* queue number */
    uint16_t size;      /* entries (a power of two) */
    uint16_t free_head; /* first free descriptor; free ones chain by next */
    uint16_t num_free;
    uint16_t avail_idx; /* next avail->idx to publish */
    uint16_t last_used; /* used->idx up to which we have consumed */
};

/* A buffer of a descriptor chain. */
struct virtio_buf {
    uint64_t addr;
    uint32_t len;
    uint32_t device_writes; /* 1: device-writable, 0: device-readable */
};

/*
 * Sets up queue `index` of d (after virtio_negotiate, before
 * virtio_driver_ok) with `size` entries (0 = the device's maximum; a
 * larger size is cut to the maximum, then rounded down to a power of two).
 * The descriptor table, available ring and used ring each take 4 KiB
 * aligned space from the arena. Returns 0, or -1 with a message.
 */
int virtq_setup(struct virtio_dev *d, struct virtq *q, uint16_t index,
                uint16_t size, struct virtio_arena *a);

/*
 * Puts a chain of n buffers (device-readable ones first, as virtio
 * requires) in the descriptor table and makes it available, without
 * notifying. Returns the head descriptor index, or -1 if n is 0 or more
 * than the free descriptors.
 */
int virtq_submit(struct virtq *q, const struct virtio_buf *bufs, unsigned n);

/* Tells the device that queue q has new buffers (QueueNotify). */
void virtq_notify(struct virtq *q);

/*
 * Takes the next used element, if any: sets *head and *len (bytes the
 * device wrote), frees the chain's descriptors and returns 1; returns 0
 * when the device has not returned anything new.
 */
int virtq_poll(struct virtq *q, uint32_t *head, uint32_t *len);

/*
 * Polls until a used element arrives (see virtq_poll). Returns 0, or -1
 * with a message when the device needs a reset or nothing arrives within
 * VIRTIO_WAIT_CYCLES TSC cycles.
 */
#define VIRTIO_WAIT_CYCLES (1ull << 37)
int virtq_wait(struct virtq *q, uint32_t *head, uint32_t *len);

/*
 * One request: submit, notify and wait for that chain to come back.
 * Nothing else may be in flight on q. Returns 0 and the used length, or -1
 * with a message.
 */
int virtq_transfer(struct virtq *q, const struct virtio_buf *bufs, unsigned n,
                   uint32_t *len);

#endif /* HVMM_VIRTIO_H */
