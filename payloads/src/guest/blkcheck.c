/*
 * blkcheck - drives a virtio-blk disk from the guest and checks its data.
 *
 * vCPU 0 finds the first virtio-blk device (DeviceID 2) among the boot
 * info's virtio-mmio devices (protocol version 2), negotiates VERSION_1
 * (and FLUSH, SIZE_MAX, SEG_MAX, BLK_SIZE, RO when offered), sets up the
 * request queue with 16 entries (so the rings wrap many times) and reads
 * the capacity. Other vCPUs return 0 at once.
 *
 * It then plans a set of non-overlapping extents: the first sector, the
 * last sector, a 128 KiB request in one descriptor, a 16-sector request
 * split into two 4 KiB descriptors, a 7-sector request split into three
 * descriptors of odd sizes at misaligned addresses, a 1 MiB request in
 * 128 KiB descriptors, then requests of assorted sizes (1 to 256 sectors)
 * at seeded random positions until `sectors` sectors are planned. Extents
 * that do not fit the disk are left out. Data buffers are scattered in
 * memory, so a device that assumes contiguous buffers fails.
 *
 * Two passes, each with its own pattern: write every extent, FLUSH (when
 * negotiated), read every extent back into a poisoned buffer and compare.
 * Pass 2 overwrites pass 1's data, so a stale disk (or writes that do
 * nothing) cannot pass. Also checked: GET_ID, a read at sector = capacity
 * and a read and a write straddling the end return IOERR (the straddling
 * write carries the last sector's current data, so a device that wrote
 * part of it changes nothing), the used lengths.
 *
 * A read-only disk (RO offered): the extents are only read, a write to
 * sector 0 must return IOERR and leave it unchanged.
 *
 * Arguments: sectors=N (sectors to write and verify per pass, 0 to 65536,
 * default 4096; at least the fixed extents, 2329 sectors on a large disk,
 * are written; fewer when the disk is too small or crowded), seed=N
 * (default 1).
 *
 * Stream mode (stream=R, R rounds; stream_mib=M, 1 to the free MiB,
 * default 32): instead of
 * the check, vCPU 0 fills an M MiB buffer with sectors that carry a
 * header (STREAM_MAGIC, round, sector) and a body derived from both
 * (never a zero byte), then writes it to sectors [0, 2048 M) (less on a
 * smaller disk) in 128 KiB requests, and prints
 *   blkcheck stream round=<r>
 * after each round. Under a memory limit smaller than M the buffer is
 * swapped out while the device reads it: the host uses this to end a VM
 * while disk writes from swapped memory are in flight and check that the
 * disk holds only whole sectors of some round or its old content, never
 * zeros (integration-tests, disk_writes_in_flight_*).
 *
 * Memory: rings, request headers and two 1056 KiB data buffers come from
 * the SDK's virtio arena at the top of free RAM.
 *
 * Output (vCPU 0), status 0:
 *   blkcheck ok sectors=<n> capacity=<c> id=<id>
 * where n = sectors written and verified per pass, c = capacity in
 * sectors, id = the GET_ID string up to its first NUL (bytes outside
 * '!'..'~' shown as '?'). A read-only disk appends " readonly=1" (n =
 * sectors read).
 * Errors, status 1:
 *   blkcheck: MISMATCH sector=<s> offset=<byte in sector> pass=<p>
 *     expected=0x<e> found=0x<f>                      (one line)
 *   blkcheck: <what went wrong>
 * No virtio-blk device, status 2:
 *   blkcheck: no virtio-blk device (boot info version <v>, <m> mmio devices)
 */
#include "common.h"
#include "virtio.h"

#define SECTOR 512u

/* Request types and status values (virtio 1.x, 5.2.6). */
#define BLK_T_IN     0u
#define BLK_T_OUT    1u
#define BLK_T_FLUSH  4u
#define BLK_T_GET_ID 8u
#define BLK_S_OK     0u
#define BLK_S_IOERR  1u
#define BLK_ID_BYTES 20u

/* Feature bits. */
#define BLK_F_SIZE_MAX 1
#define BLK_F_SEG_MAX  2
#define BLK_F_RO       5
#define BLK_F_BLK_SIZE 6
#define BLK_F_FLUSH    9

/* Configuration space. */
#define BLK_CFG_CAPACITY 0
#define BLK_CFG_SIZE_MAX 8
#define BLK_CFG_SEG_MAX  12

#define QUEUE_SIZE   16
#define MAX_PIECES   8
#define PIECE_STRIDE (132u << 10) /* a piece (<= 128 KiB) + its skew */
#define DATA_BYTES   ((uint64_t)MAX_PIECES * PIECE_STRIDE)
#define MAX_EXTENTS  1024
/* The most sectors= taken: what MAX_EXTENTS extents of the planned sizes
 * (73.9 sectors on average) can hold, rounded down. */
#define MAX_SECTORS  65536
#define PASSES       2

struct blk_hdr {
    uint32_t type;
    uint32_t reserved;
    uint64_t sector;
};

/* A run of sectors written and read as one request, and how its data is
 * cut into descriptors: piece j lies at data + j * PIECE_STRIDE + skew * j
 * (the skew misaligns the pieces in memory). */
struct extent {
    uint64_t sector;
    uint32_t count;
    uint32_t npieces;
    uint32_t skew;
    uint32_t piece_len[MAX_PIECES];
};

struct blk {
    struct virtio_dev dev;
    struct virtq q;
    uint64_t capacity;
    uint32_t size_max; /* per descriptor; 0 = no limit announced */
    uint32_t seg_max;  /* data descriptors per request; 0 = no limit */
    struct blk_hdr *hdr;
    volatile uint8_t *status;
    uint8_t *id;
    uint8_t *wbuf; /* data written */
    uint8_t *rbuf; /* data read back */
};

/* Only vCPU 0 runs the check, so the plan may live in a global. */
static struct extent plan[MAX_EXTENTS];
static unsigned nplan;

/* ---------------------------------------------------------------------- */
/* Requests                                                                */
/* ---------------------------------------------------------------------- */

static uint8_t *piece_addr(uint8_t *base, const struct extent *e, unsigned j)
{
    return base + (uint64_t)j * PIECE_STRIDE + (uint64_t)e->skew * j;
}

/*
 * One request: header, the data pieces (device-readable for OUT, else
 * device-writable), the status byte. Returns the status byte, or -1 on a
 * transport failure or a wrong used length (both reported).
 */
static int request(struct blk *b, uint32_t type, uint64_t sector,
                   const struct virtio_buf *data, unsigned ndata,
                   uint64_t data_bytes)
{
    struct virtio_buf bufs[MAX_PIECES + 2];
    b->hdr->type = type;
    b->hdr->reserved = 0;
    b->hdr->sector = sector;
    *b->status = 0xff;
    bufs[0] = (struct virtio_buf){ (uintptr_t)b->hdr, sizeof(*b->hdr), 0 };
    for (unsigned j = 0; j < ndata; j++)
        bufs[1 + j] = data[j];
    bufs[1 + ndata] = (struct virtio_buf){ (uintptr_t)b->status, 1, 1 };
    uint32_t used_len;
    if (virtq_transfer(&b->q, bufs, ndata + 2, &used_len) != 0) {
        hvmm_printf("blkcheck: request type %u sector %lu failed in the "
                    "queue\n",
                    type, sector);
        return -1;
    }
    uint8_t status = *b->status;
    /* The device reports exactly what it wrote: the data of a successful
     * read (or GET_ID) plus the status byte. */
    uint64_t want = 1;
    if (status == BLK_S_OK && (type == BLK_T_IN || type == BLK_T_GET_ID))
        want = data_bytes + 1;
    if (used_len != want) {
        hvmm_printf("blkcheck: request type %u sector %lu: used length %u, "
                    "expected %lu (status %u)\n",
                    type, sector, used_len, want, status);
        return -1;
    }
    return status;
}

/* Reads or writes extent e through buffer base. Returns the status byte or
 * -1. */
static int extent_io(struct blk *b, const struct extent *e, uint8_t *base,
                     uint32_t type)
{
    struct virtio_buf data[MAX_PIECES];
    for (unsigned j = 0; j < e->npieces; j++)
        data[j] = (struct virtio_buf){ (uintptr_t)piece_addr(base, e, j),
                                       e->piece_len[j], type != BLK_T_OUT };
    return request(b, type, e->sector, data, e->npieces,
                   (uint64_t)e->count * SECTOR);
}

/* A simple request over one buffer. */
static int simple_io(struct blk *b, uint32_t type, uint64_t sector, void *buf,
                     uint32_t len)
{
    struct virtio_buf data = { (uintptr_t)buf, len, type != BLK_T_OUT };
    return request(b, type, sector, &data, len != 0, len);
}

static int expect_status(int got, int want, const char *what)
{
    if (got == want)
        return 0;
    if (got >= 0)
        hvmm_printf("blkcheck: %s: status %d, expected %d\n", what, got, want);
    return -1;
}

/* ---------------------------------------------------------------------- */
/* Data pattern                                                            */
/* ---------------------------------------------------------------------- */

static uint64_t pattern(uint64_t seed, unsigned pass, uint64_t sector,
                        unsigned word)
{
    return mix64(seed ^ pass_key(pass + 1) ^ mix64(sector * 64 + word));
}

/* A byte cursor over an extent's pieces, seen as one stream. */
struct cursor {
    const struct extent *e;
    uint8_t *base;
    unsigned piece;
    uint32_t off;
};

static uint8_t *cursor_next(struct cursor *c)
{
    while (c->off == c->e->piece_len[c->piece]) {
        c->piece++;
        c->off = 0;
    }
    return piece_addr(c->base, c->e, c->piece) + c->off++;
}

static void fill_extent(const struct extent *e, uint8_t *base, uint64_t seed,
                        unsigned pass)
{
    struct cursor c = { e, base, 0, 0 };
    for (uint64_t s = 0; s < e->count; s++) {
        for (unsigned w = 0; w < SECTOR / 8; w++) {
            uint64_t v = pattern(seed, pass, e->sector + s, w);
            for (unsigned k = 0; k < 8; k++)
                *cursor_next(&c) = (uint8_t)(v >> (8 * k));
        }
    }
}

/* Returns 0 if the extent in base holds the pattern, else reports the
 * first wrong word and returns -1. */
static int check_extent(const struct extent *e, uint8_t *base, uint64_t seed,
                        unsigned pass)
{
    struct cursor c = { e, base, 0, 0 };
    for (uint64_t s = 0; s < e->count; s++) {
        for (unsigned w = 0; w < SECTOR / 8; w++) {
            uint64_t want = pattern(seed, pass, e->sector + s, w), got = 0;
            for (unsigned k = 0; k < 8; k++)
                got |= (uint64_t)*cursor_next(&c) << (8 * k);
            if (got != want) {
                hvmm_printf("blkcheck: MISMATCH sector=%lu offset=%u pass=%u "
                            "expected=0x%016lx found=0x%016lx\n",
                            e->sector + s, w * 8, pass + 1, want, got);
                return -1;
            }
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Planning                                                                */
/* ---------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *state)
{
    *state += 0x9e3779b97f4a7c15ull;
    return mix64(*state);
}

static int overlaps(uint64_t sector, uint32_t count)
{
    for (unsigned i = 0; i < nplan; i++)
        if (sector < plan[i].sector + plan[i].count &&
            plan[i].sector < sector + count)
            return 1;
    return 0;
}

/*
 * Adds an extent of `count` sectors with the given pieces (NULL: one piece,
 * cut to size_max if needed) at `sector`, or at a random free position if
 * that one is taken or does not fit. Returns 1 if added.
 */
static int add_extent(struct blk *b, uint64_t *rng, uint64_t sector,
                      uint32_t count, const uint32_t *pieces, unsigned n,
                      uint32_t skew)
{
    if (nplan == MAX_EXTENTS || count == 0 || count > b->capacity)
        return 0;
    struct extent e = { 0, count, 0, skew, { 0 } };
    uint64_t bytes = (uint64_t)count * SECTOR;
    if (pieces != NULL) {
        for (unsigned j = 0; j < n; j++)
            e.piece_len[j] = pieces[j];
        e.npieces = n;
    } else {
        uint64_t each = b->size_max != 0 && b->size_max < 128u << 10
                            ? b->size_max
                            : 128u << 10;
        for (uint64_t left = bytes; left != 0 && e.npieces < MAX_PIECES;) {
            uint32_t len = (uint32_t)(left < each ? left : each);
            e.piece_len[e.npieces++] = len;
            left -= len;
        }
    }
    uint64_t sum = 0;
    for (unsigned j = 0; j < e.npieces; j++) {
        if (b->size_max != 0 && e.piece_len[j] > b->size_max)
            return 0;
        sum += e.piece_len[j];
    }
    if (sum != bytes || (b->seg_max != 0 && e.npieces > b->seg_max))
        return 0;

    int tries = 0;
    while (sector > b->capacity - count || overlaps(sector, count)) {
        if (++tries > 64)
            return 0;
        sector = mul_hi(rng_next(rng), b->capacity - count + 1);
    }
    e.sector = sector;
    plan[nplan++] = e;
    return 1;
}

/* Plans the extents; returns the sectors they cover. */
static uint64_t make_plan(struct blk *b, uint64_t seed, uint64_t want)
{
    uint64_t rng = seed, cap = b->capacity, total = 0;
    nplan = 0;
    add_extent(b, &rng, 0, 1, NULL, 0, 0);       /* first sector */
    add_extent(b, &rng, cap - 1, 1, NULL, 0, 0); /* last sector */
    add_extent(b, &rng, cap / 2, 256, NULL, 0, 0); /* 128 KiB */
    static const uint32_t two[] = { 4096, 4096 };
    add_extent(b, &rng, cap / 3, 16, two, 2, 0);
    static const uint32_t three[] = { 1000, 2000, 584 };
    add_extent(b, &rng, cap / 4 + 3, 7, three, 3, 1000 + 4);
    add_extent(b, &rng, cap / 8 * 5, 2048, NULL, 0, 0); /* 1 MiB */
    for (unsigned i = 0; i < nplan; i++)
        total += plan[i].count;

    static const uint32_t sizes[] = { 1, 3, 8, 17, 64, 100, 255, 256, 2, 33 };
    for (unsigned i = 0, misses = 0; total < want && misses < 16; i++) {
        uint64_t count = sizes[i % (sizeof(sizes) / sizeof(sizes[0]))];
        if (count > want - total)
            count = want - total;
        uint64_t at = mul_hi(rng_next(&rng), cap);
        int added;
        if (i % 3 == 1 && count >= 2) {
            /* Two pieces, cut inside a sector, the second misaligned. */
            uint32_t pieces[2] = { (uint32_t)count * SECTOR / 2 + 8, 0 };
            pieces[1] = (uint32_t)count * SECTOR - pieces[0];
            added = add_extent(b, &rng, at, (uint32_t)count, pieces, 2, 520);
        } else {
            added = add_extent(b, &rng, at, (uint32_t)count, NULL, 0, 0);
        }
        if (added)
            total += count;
        else
            misses++;
    }
    return total;
}

/* ---------------------------------------------------------------------- */
/* The check                                                               */
/* ---------------------------------------------------------------------- */

static void print_id(const uint8_t *id)
{
    for (unsigned i = 0; i < BLK_ID_BYTES && id[i] != 0; i++)
        hvmm_putc(id[i] >= '!' && id[i] <= '~' ? (char)id[i] : '?');
}

/* Requests past the end of the disk must fail with IOERR. */
static int check_out_of_range(struct blk *b, uint64_t seed)
{
    uint64_t cap = b->capacity;
    if (expect_status(simple_io(b, BLK_T_IN, cap, b->rbuf, SECTOR),
                      BLK_S_IOERR, "read at sector=capacity") != 0)
        return -1;
    if (expect_status(simple_io(b, BLK_T_IN, cap - 1, b->rbuf, 2 * SECTOR),
                      BLK_S_IOERR, "read straddling the end") != 0)
        return -1;
    if (expect_status(simple_io(b, BLK_T_IN, UINT64_MAX / SECTOR, b->rbuf,
                                SECTOR),
                      BLK_S_IOERR, "read at a huge sector") != 0)
        return -1;
    if (b->dev.features & (1ull << BLK_F_RO))
        return 0;
    /* The last sector's pass-1 data, then one sector past the end. */
    struct extent last = { cap - 1, 2, 1, 0, { 2 * SECTOR } };
    fill_extent(&last, b->wbuf, seed, 0);
    return expect_status(simple_io(b, BLK_T_OUT, cap - 1, b->wbuf, 2 * SECTOR),
                         BLK_S_IOERR, "write straddling the end");
}

static int run_pass(struct blk *b, uint64_t seed, unsigned pass)
{
    for (unsigned i = 0; i < nplan; i++) {
        fill_extent(&plan[i], b->wbuf, seed, pass);
        if (expect_status(extent_io(b, &plan[i], b->wbuf, BLK_T_OUT),
                          BLK_S_OK, "write") != 0) {
            hvmm_printf("blkcheck: (write of sector=%lu count=%u)\n",
                        plan[i].sector, plan[i].count);
            return -1;
        }
    }
    if (pass == 0 && check_out_of_range(b, seed) != 0)
        return -1;
    if ((b->dev.features & (1ull << BLK_F_FLUSH)) &&
        expect_status(simple_io(b, BLK_T_FLUSH, 0, NULL, 0), BLK_S_OK,
                      "flush") != 0)
        return -1;
    for (unsigned i = 0; i < nplan; i++) {
        memset(b->rbuf, 0xa5, DATA_BYTES);
        if (expect_status(extent_io(b, &plan[i], b->rbuf, BLK_T_IN), BLK_S_OK,
                          "read") != 0) {
            hvmm_printf("blkcheck: (read of sector=%lu count=%u)\n",
                        plan[i].sector, plan[i].count);
            return -1;
        }
        if (check_extent(&plan[i], b->rbuf, seed, pass) != 0)
            return -1;
    }
    return 0;
}

/* A read-only disk: reads work, a write fails and changes nothing. */
static int run_readonly(struct blk *b, uint64_t seed)
{
    for (unsigned i = 0; i < nplan; i++)
        if (expect_status(extent_io(b, &plan[i], b->rbuf, BLK_T_IN), BLK_S_OK,
                          "read") != 0)
            return -1;
    if (check_out_of_range(b, seed) != 0)
        return -1;
    uint8_t *before = b->rbuf, *after = b->rbuf + SECTOR;
    if (expect_status(simple_io(b, BLK_T_IN, 0, before, SECTOR), BLK_S_OK,
                      "read of sector 0") != 0)
        return -1;
    for (unsigned i = 0; i < SECTOR; i++)
        b->wbuf[i] = (uint8_t)~before[i];
    if (expect_status(simple_io(b, BLK_T_OUT, 0, b->wbuf, SECTOR),
                      BLK_S_IOERR, "write to a read-only disk") != 0)
        return -1;
    if (expect_status(simple_io(b, BLK_T_IN, 0, after, SECTOR), BLK_S_OK,
                      "read of sector 0") != 0)
        return -1;
    if (memcmp(before, after, SECTOR) != 0) {
        hvmm_printf("blkcheck: a refused write changed sector 0 of a "
                    "read-only disk\n");
        return -1;
    }
    return 0;
}

#define STREAM_MAGIC 0x4d41455254534b42ull /* "BKSTREAM" */
#define STREAM_REQUEST_BYTES (128u << 10)

/* One sector of round `round`: header, then a body no byte of which is 0. */
static void stream_sector(uint8_t *at, uint64_t round, uint64_t sector)
{
    uint64_t header[3] = { STREAM_MAGIC, round, sector };
    memcpy(at, header, sizeof(header));
    for (unsigned i = sizeof(header); i < SECTOR; i++)
        at[i] = (uint8_t)((round * 31 + sector * 7 + i) | 1);
}

static int run_stream(struct blk *b, uint8_t *buf, uint64_t buf_bytes,
                      uint64_t rounds)
{
    uint64_t sectors = buf_bytes / SECTOR;
    if (sectors > b->capacity)
        sectors = b->capacity;
    uint64_t per_request = STREAM_REQUEST_BYTES / SECTOR;
    if (b->size_max != 0 && b->size_max < STREAM_REQUEST_BYTES)
        per_request = b->size_max / SECTOR;
    for (uint64_t round = 1; round <= rounds; round++) {
        for (uint64_t s = 0; s < sectors; s++)
            stream_sector(buf + s * SECTOR, round, s);
        for (uint64_t s = 0; s < sectors; s += per_request) {
            uint64_t n = sectors - s < per_request ? sectors - s : per_request;
            if (expect_status(simple_io(b, BLK_T_OUT, s, buf + s * SECTOR,
                                        (uint32_t)(n * SECTOR)),
                              BLK_S_OK, "stream write") != 0)
                return -1;
        }
        hvmm_printf("blkcheck stream round=%lu\n", round);
    }
    return 0;
}

static int setup(struct blk *b, const struct hvmm_boot_info *info,
                 struct virtio_arena *arena, uint64_t extra_bytes)
{
    uint64_t arena_bytes = 2 * DATA_BYTES + 16 * 4096 + extra_bytes;
    if (virtio_arena_init(arena, info, arena_bytes) == 0) {
        hvmm_printf("blkcheck: no free range holds %lu bytes for rings and "
                    "buffers\n",
                    arena_bytes);
        return -1;
    }
    uint64_t wanted = (1ull << BLK_F_FLUSH) | (1ull << BLK_F_SIZE_MAX) |
                      (1ull << BLK_F_SEG_MAX) | (1ull << BLK_F_RO) |
                      (1ull << BLK_F_BLK_SIZE);
    if (virtio_negotiate(&b->dev, wanted) != 0)
        return -1;
    if (virtq_setup(&b->dev, &b->q, 0, QUEUE_SIZE, arena) != 0)
        return -1;
    b->hdr = virtio_arena_alloc(arena, sizeof(*b->hdr), 16);
    b->status = virtio_arena_alloc(arena, 1, 1);
    b->id = virtio_arena_alloc(arena, BLK_ID_BYTES + 1, 8);
    b->wbuf = virtio_arena_alloc(arena, DATA_BYTES, 4096);
    b->rbuf = virtio_arena_alloc(arena, DATA_BYTES, 4096);
    if (b->hdr == NULL || b->status == NULL || b->id == NULL ||
        b->wbuf == NULL || b->rbuf == NULL) {
        hvmm_printf("blkcheck: arena too small\n");
        return -1;
    }
    if (virtio_driver_ok(&b->dev) != 0)
        return -1;
    b->capacity = virtio_config_read64(&b->dev, BLK_CFG_CAPACITY);
    if (b->dev.features & (1ull << BLK_F_SIZE_MAX))
        b->size_max = virtio_config_read32(&b->dev, BLK_CFG_SIZE_MAX);
    if (b->dev.features & (1ull << BLK_F_SEG_MAX))
        b->seg_max = virtio_config_read32(&b->dev, BLK_CFG_SEG_MAX);
    if (b->capacity == 0) {
        hvmm_printf("blkcheck: the disk has no sectors\n");
        return -1;
    }
    if (b->size_max != 0 && b->size_max < SECTOR) {
        hvmm_printf("blkcheck: size_max=%u is below one sector\n",
                    b->size_max);
        return -1;
    }
    return 0;
}

int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info)
{
    uint64_t sectors = 4096, seed = 1, stream = 0, stream_mib = 32;
    /* stream_mib= is bounded by the free RAM the buffer comes from (the
     * arena then says whether it fits beside the rings). */
    uint64_t free_mib = hvmm_free_bytes(info) >> 20;
    const struct hvmm_arg_spec specs[] = {
        { "sectors", HVMM_ARG_NUMBER, &sectors, HVMM_ARG_RANGE(0, MAX_SECTORS) },
        { "seed", HVMM_ARG_NUMBER, &seed, HVMM_ARG_ANY },
        { "stream", HVMM_ARG_NUMBER, &stream, HVMM_ARG_ANY },
        { "stream_mib", HVMM_ARG_NUMBER, &stream_mib,
          HVMM_ARG_RANGE(1, free_mib > 1 ? free_mib : 1) },
        HVMM_ARG_END,
    };
    if (hvmm_parse_args(info, "blkcheck", specs, vcpu == 0) != 0)
        return 2;
    if (vcpu != 0)
        return 0;

    struct blk b;
    memset(&b, 0, sizeof(b));
    if (virtio_find(info, VIRTIO_ID_BLOCK, 0, &b.dev) != 0) {
        uint64_t count;
        hvmm_mmio_devices(info, &count);
        hvmm_printf("blkcheck: no virtio-blk device (boot info version %u, "
                    "%lu mmio devices)\n",
                    info->version, count);
        return 2;
    }
    struct virtio_arena arena;
    uint64_t stream_bytes = stream ? stream_mib << 20 : 0;
    if (setup(&b, info, &arena, stream_bytes) != 0)
        return 1;
    if (stream) {
        uint8_t *buf = virtio_arena_alloc(&arena, stream_bytes, 4096);
        if (buf == NULL) {
            hvmm_printf("blkcheck: arena too small for stream_mib=%lu\n",
                        stream_mib);
            return 1;
        }
        return run_stream(&b, buf, stream_bytes, stream) != 0;
    }

    memset(b.id, 0, BLK_ID_BYTES + 1);
    if (expect_status(simple_io(&b, BLK_T_GET_ID, 0, b.id, BLK_ID_BYTES),
                      BLK_S_OK, "get id") != 0)
        return 1;

    uint64_t total = make_plan(&b, seed, sectors);
    int readonly = (b.dev.features & (1ull << BLK_F_RO)) != 0;
    if (readonly) {
        if (run_readonly(&b, seed) != 0)
            return 1;
    } else {
        for (unsigned pass = 0; pass < PASSES; pass++)
            if (run_pass(&b, seed, pass) != 0)
                return 1;
    }
    hvmm_printf("blkcheck ok sectors=%lu capacity=%lu id=", total,
                b.capacity);
    print_id(b.id);
    hvmm_puts(readonly ? " readonly=1\n" : "\n");
    return 0;
}
