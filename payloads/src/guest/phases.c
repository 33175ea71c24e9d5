/*
 * phases - a hot set that moves and changes size: random 4 KiB page
 * touches within one hot set per phase, every touch checked.
 *
 * Arguments:
 *   heap=SIZE    the heap (default 512M), whole 256 KiB blocks, at least
 *                4 MiB per vCPU; heap and the generation table (4 bytes
 *                per 4 KiB page) must fit in free RAM
 *   phases=N     phases, 1 to 10^6 (default 6)
 *   ops=N        page touches per phase per vCPU, 0 to 10^12 (default
 *                2000000)
 *   seed=N       varies the data and the touches (default 1)
 *   warm=0|1     1: before the first phase, each vCPU writes every one of
 *                its pages of the whole heap once, so that all of it is
 *                resident and the phases' sets are the only memory in use
 *                from then on (a known active set; default 0)
 *
 * The heap is cut into blocks of 64 pages (256 KiB); block b belongs to
 * vCPU b mod n, so the vCPUs share every 2 MiB chunk but never a page.
 * Phase p has hot set SETS[p mod 6], in sixteenths of the heap (sizes for
 * the default 512M):
 *   0 small        every page of [0, 1/16)           32 MiB
 *   1 large        every page of [0, 4/16)           128 MiB, around 0
 *   2 moved        every page of [12/16, 13/16)      32 MiB, elsewhere
 *   3 scattered    the first page of every block     8 MiB, 8 pages in
 *                  of the whole heap                 every 2 MiB chunk
 *   4 small-again  phase 0's set
 *   5 large-moved  every page of [8/16, 12/16)       128 MiB
 * In each phase a vCPU touches ops pages drawn uniformly from its own
 * pages of the set. A touch checks nine words of the page (one in each
 * 512 bytes and the last) against the page's generation (a table after
 * the heap; generation 0 reads zero) and writes the next generation's
 * words. At the end of the phase the vCPU checks every one of its pages
 * of the set. vCPUs do not wait for each other between phases.
 *
 * Output, per phase and vCPU:
 *   phases vcpu=<i> phase=<p> set=<name> hot_bytes=<set size> touches=<t>
 *   cycles=<rdtsc>
 * then one line per vCPU:
 *   phases vcpu=<i> phases=<N> touches=<T> cycles=<rdtsc> ok
 * or, on the first wrong word (exit 1):
 *   phases: MISMATCH vcpu=<i> phase=<p> page=<k> addr=0x<a> expected=0x<e>
 *   found=0x<f> gen=<g>
 * where gen is the generation the expected value belongs to (0 = zero).
 */
#include "common.h"

#define BLOCK_PAGES 64ull
#define BLOCK_BYTES (BLOCK_PAGES * PAGE_SIZE)
#define MAX_OPS 1000000000000ull

struct set {
    const char *name;
    uint64_t first16; /* start, in sixteenths of the heap */
    uint64_t span16;  /* length, in sixteenths of the heap */
    int sparse;       /* only the first page of each block */
};

static const struct set SETS[] = {
    { "small", 0, 1, 0 },
    { "large", 0, 4, 0 },
    { "moved", 12, 1, 0 },
    { "scattered", 0, 16, 1 },
    { "small-again", 0, 1, 0 },
    { "large-moved", 8, 4, 0 },
};
#define NSETS (sizeof(SETS) / sizeof(SETS[0]))

/* Byte offsets of the words checked in each page. */
static const uint64_t word_offsets[] = {
    0, 520, 1040, 1560, 2080, 2600, 3120, 3640, PAGE_SIZE - 8,
};
#define NWORDS (sizeof(word_offsets) / sizeof(word_offsets[0]))

struct heap {
    const struct hvmm_boot_info *info;
    uint64_t lead;     /* free-space offset of page 0 */
    uint64_t table_off; /* free-space offset of the generation table */
    uint64_t seed;
};

static uint64_t word_value(const struct heap *h, uint64_t addr, uint64_t gen)
{
    if (gen == 0)
        return 0;
    uint64_t v = mix64(addr ^ mix64(mix64(h->seed) ^ pass_key(gen)));
    return v != 0 ? v : 1; /* never confusable with untouched memory */
}

static volatile uint32_t *gen_of(const struct heap *h, uint64_t page)
{
    return (volatile uint32_t *)hvmm_free_addr(h->info, h->table_off + page * 4);
}

/* Checks page's words against its generation; on a wrong one prints it and
 * returns -1. Otherwise writes the next generation if `write`. */
static int touch(const struct heap *h, unsigned vcpu, uint64_t phase,
                 uint64_t page, int write)
{
    uint64_t addr = hvmm_free_addr(h->info, h->lead + page * PAGE_SIZE);
    volatile uint64_t *w = (volatile uint64_t *)addr;
    volatile uint32_t *gen = gen_of(h, page);
    uint64_t g = *gen;
    for (unsigned i = 0; i < NWORDS; i++) {
        uint64_t a = addr + word_offsets[i];
        uint64_t want = word_value(h, a, g);
        uint64_t found = w[word_offsets[i] / 8];
        if (found != want) {
            hvmm_printf("phases: MISMATCH vcpu=%u phase=%lu page=%lu addr=0x%lx "
                        "expected=0x%lx found=0x%lx gen=%lu\n",
                        vcpu, phase, page, a, want, found, g);
            return -1;
        }
    }
    if (write) {
        for (unsigned i = 0; i < NWORDS; i++)
            w[word_offsets[i] / 8] = word_value(h, addr + word_offsets[i], g + 1);
        *gen = (uint32_t)(g + 1);
    }
    return 0;
}

int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info)
{
    uint64_t free_bytes = hvmm_free_bytes(info);
    uint64_t heap_bytes = 512ull << 20, phases = 6, ops = 2000000, seed = 1, warm = 0;
    const struct hvmm_arg_spec specs[] = {
        { "heap", HVMM_ARG_SIZE, &heap_bytes, HVMM_ARG_ANY }, /* checked below */
        { "phases", HVMM_ARG_NUMBER, &phases, HVMM_ARG_RANGE(1, MAX_PASSES) },
        { "ops", HVMM_ARG_NUMBER, &ops, HVMM_ARG_RANGE(0, MAX_OPS) },
        { "seed", HVMM_ARG_NUMBER, &seed, HVMM_ARG_ANY },
        { "warm", HVMM_ARG_NUMBER, &warm, HVMM_ARG_RANGE(0, 1) },
        HVMM_ARG_END,
    };
    int report = vcpu == 0;
    if (hvmm_parse_args(info, "phases", specs, report) != 0)
        return 2;
    unsigned n = vcpu_count(info);
    /* Every vCPU owns a block of the smallest set (a sixteenth). */
    uint64_t min_bytes = 16 * BLOCK_BYTES * n;
    if (heap_bytes < min_bytes) {
        if (report)
            hvmm_printf("phases: heap=%lu is less than %lu (4 MiB per vCPU)\n",
                        heap_bytes, min_bytes);
        return 2;
    }
    uint64_t blocks = heap_bytes / BLOCK_BYTES;
    uint64_t used_bytes = blocks * BLOCK_BYTES;
    uint64_t table_bytes = blocks * BLOCK_PAGES * 4;
    if (used_bytes > free_bytes || table_bytes > free_bytes - used_bytes) {
        if (report)
            hvmm_printf("phases: heap=%lu and its generation table (%lu bytes) "
                        "are more than the free RAM (free_bytes=%lu)\n",
                        heap_bytes, table_bytes, free_bytes);
        return 2;
    }
    struct heap h = {
        .info = info,
        .lead = chunk_lead(info, used_bytes + table_bytes, free_bytes),
        .seed = seed,
    };
    h.table_off = h.lead + used_bytes;
    uint64_t rng = mix64(seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)vcpu << 32 | 0x5048));

    uint64_t start = hvmm_rdtsc(), touches = 0;
    if (warm)
        for (uint64_t b = vcpu; b < blocks; b += n)
            for (uint64_t j = 0; j < BLOCK_PAGES; j++)
                if (touch(&h, vcpu, 0, b * BLOCK_PAGES + j, 1) != 0)
                    return 1;
    for (uint64_t p = 0; p < phases; p++) {
        const struct set *set = &SETS[p % NSETS];
        uint64_t lo = blocks * set->first16 / 16;
        uint64_t hi = blocks * (set->first16 + set->span16) / 16;
        /* Own blocks: first, first + n, ... below hi (at least one: the set
         * spans at least n blocks). */
        uint64_t first = lo + (vcpu + n - lo % n) % n;
        uint64_t count = first < hi ? (hi - 1 - first) / n + 1 : 0;
        uint64_t pages = set->sparse ? 1 : BLOCK_PAGES;
        uint64_t phase_start = hvmm_rdtsc();
        for (uint64_t i = 0; i < ops && count != 0; i++) {
            uint64_t block = first + mul_hi(splitmix_next(&rng), count) * n;
            uint64_t page = block * BLOCK_PAGES +
                            (set->sparse ? 0 : mul_hi(splitmix_next(&rng), BLOCK_PAGES));
            if (touch(&h, vcpu, p, page, 1) != 0)
                return 1;
        }
        for (uint64_t b = first; b < hi; b += n)
            for (uint64_t j = 0; j < pages; j++)
                if (touch(&h, vcpu, p, b * BLOCK_PAGES + j, 0) != 0)
                    return 1;
        uint64_t phase_touches = count != 0 ? ops : 0;
        touches += phase_touches;
        hvmm_printf("phases vcpu=%u phase=%lu set=%s hot_bytes=%lu touches=%lu "
                    "cycles=%lu\n",
                    vcpu, p, set->name, (uint64_t)((hi - lo) * pages * PAGE_SIZE),
                    phase_touches, hvmm_rdtsc() - phase_start);
    }
    hvmm_printf("phases vcpu=%u phases=%lu touches=%lu cycles=%lu ok\n", vcpu,
                phases, touches, hvmm_rdtsc() - start);
    return 0;
}
