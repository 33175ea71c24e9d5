/*
 * verify - data integrity under concurrent faults.
 *
 * Arguments:
 *   bytes=SIZE   working set (default: all free RAM), whole 4 KiB pages
 *   passes=N     generations to write, 0 to 10^6 (default 2)
 *   seed=N       varies the data and the visiting orders (default 1)
 *   cycles=N     keep writing generations, past passes, until N TSC cycles
 *                have passed since this vCPU started (default 0: passes
 *                alone); the host turns a duration into cycles with the
 *                VM's TSC frequency (tsc_khz in --stats-json). Checked
 *                between generations, so a vCPU overshoots by at most one.
 *
 * The working set is viewed as 4 KiB pages: page k is free-space offset
 * k * 4096. Pages are grouped in chunks of 512 consecutive pages (2 MiB of
 * free space). Shares interleave inside every chunk: page k belongs to vCPU
 * k mod n, so all vCPUs work on every chunk.
 *
 * For each generation g = 1..passes, every vCPU visits all chunks in an
 * order that is a permutation depending on (g, vCPU, seed), and inside each
 * chunk its own pages in a permuted order. At each page it checks the words
 * of generation g-1 (generation 0: the page reads zero) and then writes
 * generation g's words. A final check-only pass follows the last generation.
 * The words checked and written are the first, the middle and the last
 * 8-byte word of each page; their value mixes (address, generation, seed).
 *
 * Output, one line per vCPU:
 *   verify vcpu=<i> pages=<page checks> passes=<p> cycles=<rdtsc> ok
 * where p is the generations written (more than passes= with cycles=) and
 * each page check covers its three words.
 * or, on the first wrong word (this vCPU then exits with status 1):
 *   verify: MISMATCH vcpu=<i> addr=0x<a> expected=0x<e> found=0x<f> gen=<g>
 * where gen is the generation the expected value belongs to (0 = zero).
 */
#include "common.h"

#define CHUNK_PAGES 512ull

/* Byte offsets of the words checked in each page: first, middle, last. */
static const uint64_t word_offsets[] = { 0, PAGE_SIZE / 2, PAGE_SIZE - 8 };
#define NWORDS (sizeof(word_offsets) / sizeof(word_offsets[0]))

/* The key of generation g (0 stands for "never written"). */
static uint64_t gen_key(uint64_t seed, uint64_t g)
{
    return mix64(mix64(seed) ^ pass_key(g));
}

/* The value of the word at addr in the generation with key gkey. */
static uint64_t word_value(uint64_t addr, uint64_t g, uint64_t gkey)
{
    if (g == 0)
        return 0;
    uint64_t v = mix64(addr ^ gkey);
    return v != 0 ? v : 1; /* never confusable with untouched memory */
}

int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info)
{
    uint64_t free_bytes = hvmm_free_bytes(info);
    uint64_t bytes = free_bytes, passes = 2, seed = 1, cycles = 0;
    const struct hvmm_arg_spec specs[] = {
        { "bytes", HVMM_ARG_SIZE, &bytes, HVMM_ARG_ANY }, /* check_bytes */
        /* passes=0 only checks that fresh memory reads zero. */
        { "passes", HVMM_ARG_NUMBER, &passes, HVMM_ARG_RANGE(0, MAX_PASSES) },
        { "seed", HVMM_ARG_NUMBER, &seed, HVMM_ARG_ANY },
        { "cycles", HVMM_ARG_NUMBER, &cycles, HVMM_ARG_ANY },
        HVMM_ARG_END,
    };
    if (hvmm_parse_args(info, "verify", specs, vcpu == 0) != 0 ||
        check_bytes("verify", bytes, free_bytes, vcpu == 0) != 0)
        return 2;

    unsigned n = vcpu_count(info);
    uint64_t pages = bytes / PAGE_SIZE;
    uint64_t chunks = (pages + CHUNK_PAGES - 1) / CHUNK_PAGES;
    uint64_t checked = 0;

    /*
     * Page k lives at free-space offset lead + k * 4096 (wrapping around),
     * where lead skips to the first 2 MiB-aligned free address: the
     * payload's chunks then coincide with the VMM's 2 MiB chunks, so the
     * vCPUs really contend for the same chunk (free ranges other than the
     * first start and end on 2 MiB boundaries).
     */
    uint64_t first_free = info->range_count ? info->ranges[0].start : 0;
    uint64_t lead = ((first_free + (CHUNK_PAGES * PAGE_SIZE - 1)) &
                     ~(CHUNK_PAGES * PAGE_SIZE - 1)) - first_free;
    if (lead >= free_bytes)
        lead = 0;

    uint64_t start = hvmm_rdtsc();
    /*
     * Generations 1..written check g-1 and write g; the pass after them
     * only checks. written is passes, or more while cycles= has not passed.
     */
    uint64_t written = 0;
    for (uint64_t g = 1;; g++) {
        int writing = g <= passes ||
                      (cycles != 0 && hvmm_rdtsc() - start < cycles);
        uint64_t want_key = gen_key(seed, g - 1);
        uint64_t write_key = gen_key(seed, g);
        uint64_t order_key = mix64(seed ^ mix64(g ^ ((uint64_t)vcpu << 32)));

        struct perm chunk_order;
        perm_init(&chunk_order, chunks, order_key);
        for (uint64_t ci = 0; ci < chunks; ci++) {
            uint64_t c = perm_at(&chunk_order, ci);
            uint64_t first = c * CHUNK_PAGES; /* first page of the chunk */
            uint64_t count = pages - first < CHUNK_PAGES ? pages - first
                                                         : CHUNK_PAGES;
            /* Own pages: first + j0 + t * n for t in [0, mine). */
            uint64_t j0 = (vcpu + n - first % n) % n;
            if (j0 >= count)
                continue;
            uint64_t mine = (count - 1 - j0) / n + 1;

            struct perm page_order;
            perm_init(&page_order, mine, mix64(order_key ^ c));
            for (uint64_t t = 0; t < mine; t++) {
                uint64_t k = first + j0 + perm_at(&page_order, t) * n;
                uint64_t off = lead + k * PAGE_SIZE;
                if (off >= free_bytes)
                    off -= free_bytes;
                uint64_t page = hvmm_free_addr(info, off);
                volatile uint64_t *w = (volatile uint64_t *)page;

                for (unsigned i = 0; i < NWORDS; i++) {
                    uint64_t a = page + word_offsets[i];
                    uint64_t expected = word_value(a, g - 1, want_key);
                    uint64_t found = w[word_offsets[i] / 8];
                    if (found != expected) {
                        hvmm_printf("verify: MISMATCH vcpu=%u addr=0x%lx "
                                    "expected=0x%lx found=0x%lx gen=%lu\n",
                                    vcpu, a, expected, found, g - 1);
                        return 1;
                    }
                }
                if (writing)
                    for (unsigned i = 0; i < NWORDS; i++)
                        w[word_offsets[i] / 8] =
                            word_value(page + word_offsets[i], g, write_key);
                checked++;
            }
        }
        if (!writing)
            break;
        written = g;
    }
    uint64_t elapsed = hvmm_rdtsc() - start;

    hvmm_printf("verify vcpu=%u pages=%lu passes=%lu cycles=%lu ok\n", vcpu,
                checked, written, elapsed);
    return 0;
}
