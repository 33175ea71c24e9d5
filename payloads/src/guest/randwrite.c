/*
 * randwrite - random write throughput, the same amount of work as seqwrite.
 *
 * Arguments:
 *   bytes=SIZE   working set (default: all free RAM)
 *   passes=N     passes over the share, 1 to 10^6 (default 1)
 *   seed=N       PRNG seed (default 1)
 *
 * The working set is split over the vCPUs exactly as in seqwrite. In each
 * pass a vCPU performs as many 8-byte writes as its share has words, each
 * to a word chosen at random (xorshift64*, seeded from seed and the vCPU
 * index) in its share; pass p writes address ^ pass_key(p).
 *
 * Output, one line per vCPU:
 *   randwrite vcpu=<i> bytes=<bytes written over all passes> cycles=<rdtsc>
 *   passes=<p>
 */
#include "common.h"

/* The share as up to MAX_SEGS guest-address segments. */
#define MAX_SEGS 32
struct seg {
    uint64_t addr;
    uint64_t len;
};

static uint64_t xorshift64star(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545f4914f6cdd1dull;
}

int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info)
{
    uint64_t free_bytes = hvmm_free_bytes(info);
    uint64_t bytes = free_bytes, passes = 1, seed = 1;
    const struct hvmm_arg_spec specs[] = {
        { "bytes", HVMM_ARG_SIZE, &bytes, HVMM_ARG_ANY }, /* check_bytes */
        { "passes", HVMM_ARG_NUMBER, &passes, HVMM_ARG_RANGE(1, MAX_PASSES) },
        { "seed", HVMM_ARG_NUMBER, &seed, HVMM_ARG_ANY },
        HVMM_ARG_END,
    };
    if (hvmm_parse_args(info, "randwrite", specs, vcpu == 0) != 0 ||
        check_bytes("randwrite", bytes, free_bytes, vcpu == 0) != 0)
        return 2;

    struct share s = vcpu_share(bytes & ~7ull, vcpu_count(info), vcpu);
    uint64_t words = s.len / 8;

    /* Resolve the share's segments once; with more than MAX_SEGS of them
     * (an unusually fragmented free space) fall back to a lookup per write. */
    struct seg segs[MAX_SEGS];
    unsigned nsegs = 0;
    int fragmented = 0;
    struct hvmm_free_iter it;
    uint64_t addr, len;
    hvmm_free_iter_init(&it, info, s.off, s.len);
    while (hvmm_free_iter_next(&it, &addr, &len)) {
        if (nsegs == MAX_SEGS) {
            fragmented = 1;
            break;
        }
        segs[nsegs].addr = addr;
        segs[nsegs].len = len;
        nsegs++;
    }

    uint64_t state = mix64(seed ^ mix64(vcpu + 1));
    if (state == 0)
        state = 1; /* xorshift must not start at 0 */

    uint64_t start = hvmm_rdtsc();
    for (uint64_t p = 1; p <= passes; p++) {
        uint64_t key = pass_key(p);
        for (uint64_t w = 0; w < words; w++) {
            uint64_t off = mul_hi(xorshift64star(&state), words) * 8;
            if (fragmented) {
                addr = hvmm_free_addr(info, s.off + off);
            } else {
                unsigned i = 0;
                while (off >= segs[i].len)
                    off -= segs[i++].len;
                addr = segs[i].addr + off;
            }
            *(volatile uint64_t *)addr = addr ^ key;
        }
    }
    uint64_t cycles = hvmm_rdtsc() - start;

    hvmm_printf("randwrite vcpu=%u bytes=%lu cycles=%lu passes=%lu\n", vcpu,
                words * 8 * passes, cycles, passes);
    return 0;
}
