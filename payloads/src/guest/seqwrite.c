/*
 * seqwrite - sequential write bandwidth (like vm-scalability's
 * case-swap-w-seq).
 *
 * Arguments:
 *   bytes=SIZE   working set (default: all free RAM)
 *   passes=N     how many times each vCPU writes its share, 1 to 10^6
 *                (default 1)
 *
 * The working set (the first `bytes` of free space, rounded down to 8
 * bytes) is split evenly over the vCPUs (4 KiB-aligned shares, the last
 * vCPU takes the remainder). Each vCPU writes every 8-byte word of its share
 * from start to end, `passes` times; pass p writes address ^ pass_key(p).
 *
 * Output, one line per vCPU:
 *   seqwrite vcpu=<i> bytes=<bytes written over all passes> cycles=<rdtsc>
 *   passes=<p>
 */
#include "common.h"

static void fill(uint64_t addr, uint64_t len, uint64_t key)
{
    uint64_t *p = (uint64_t *)addr;
    uint64_t *end = p + len / 8;
    for (; p < end; p++)
        *p = (uint64_t)p ^ key;
}

int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info)
{
    uint64_t free_bytes = hvmm_free_bytes(info);
    uint64_t bytes = free_bytes, passes = 1;
    const struct hvmm_arg_spec specs[] = {
        { "bytes", HVMM_ARG_SIZE, &bytes, HVMM_ARG_ANY }, /* check_bytes */
        { "passes", HVMM_ARG_NUMBER, &passes, HVMM_ARG_RANGE(1, MAX_PASSES) },
        HVMM_ARG_END,
    };
    if (hvmm_parse_args(info, "seqwrite", specs, vcpu == 0) != 0 ||
        check_bytes("seqwrite", bytes, free_bytes, vcpu == 0) != 0)
        return 2;

    struct share s = vcpu_share(bytes & ~7ull, vcpu_count(info), vcpu);
    uint64_t start = hvmm_rdtsc();
    for (uint64_t p = 1; p <= passes; p++) {
        struct hvmm_free_iter it;
        uint64_t addr, len;
        hvmm_free_iter_init(&it, info, s.off, s.len);
        while (hvmm_free_iter_next(&it, &addr, &len))
            fill(addr, len, pass_key(p));
        hvmm_barrier(); /* every pass really writes */
    }
    uint64_t cycles = hvmm_rdtsc() - start;

    hvmm_printf("seqwrite vcpu=%u bytes=%lu cycles=%lu passes=%lu\n", vcpu,
                s.len * passes, cycles, passes);
    return 0;
}
