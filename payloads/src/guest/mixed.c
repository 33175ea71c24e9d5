/*
 * mixed - scattered hot pages beside a sequential stream: what an
 * operating system's memory looks like to a VMM (page cache and slab pages
 * spread over RAM, plus streaming I/O).
 *
 * Arguments:
 *   hot=N        hot chunks (default 128): 2 MiB chunks of free space at
 *                its start, each with one hot 4 KiB page
 *   stream=SIZE  the stream (default 512M), after the hot chunks; hot
 *                chunks and stream must fit in free RAM
 *   passes=N     passes over the stream, 1 to 10^6 (default 2)
 *
 * Hot chunk k belongs to vCPU k mod n; the stream is split over the vCPUs
 * in contiguous shares. Each round a vCPU writes the next 2 MiB of its
 * stream share (8-byte words, ascending), then touches its hot pages: it
 * checks the word the previous round wrote in each and writes this round's.
 * Rounds: passes x (share / 2 MiB).
 *
 * Output, one line per vCPU:
 *   mixed vcpu=<i> bytes=<guest bytes> rounds=<r> hot_touches=<t>
 *   cycles=<rdtsc> ok
 * where bytes counts the stream's bytes written plus 4 KiB per hot-page
 * touch (the page is the unit of hot work), or on a wrong hot word (exit 1):
 *   mixed: MISMATCH vcpu=<i> addr=0x<a> expected=0x<e> found=0x<f>
 */
#include "common.h"

#define CHUNK (2ull << 20)
#define CHUNK_PAGES 512ull

static uint64_t hot_value(uint64_t addr, uint64_t round)
{
    return round == 0 ? 0 : mix64(addr ^ pass_key(round));
}

int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info)
{
    uint64_t free_bytes = hvmm_free_bytes(info);
    uint64_t hot = 128, stream = 512ull << 20, passes = 2;
    /* hot= is bounded by the chunks free RAM has (so hot * CHUNK cannot
     * wrap); check_bytes then checks hot chunks and stream together. */
    const struct hvmm_arg_spec specs[] = {
        { "hot", HVMM_ARG_NUMBER, &hot, HVMM_ARG_RANGE(0, free_bytes / CHUNK) },
        { "stream", HVMM_ARG_SIZE, &stream, HVMM_ARG_RANGE(0, free_bytes) },
        { "passes", HVMM_ARG_NUMBER, &passes, HVMM_ARG_RANGE(1, MAX_PASSES) },
        HVMM_ARG_END,
    };
    if (hvmm_parse_args(info, "mixed", specs, vcpu == 0) != 0)
        return 2;
    unsigned n = vcpu_count(info);
    uint64_t hot_bytes = hot * CHUNK;
    if (check_bytes("mixed", hot_bytes + stream, free_bytes, vcpu == 0) != 0)
        return 2;

    /* This vCPU's hot pages: one per chunk k = vcpu, vcpu + n, ... */
    uint64_t mine = hot > vcpu ? (hot - vcpu + n - 1) / n : 0;
    /* The stream share, in whole 2 MiB rounds. */
    struct share s = vcpu_share(stream & ~(CHUNK - 1), n, vcpu);
    uint64_t steps = s.len / CHUNK;
    if (steps == 0)
        steps = 1;
    uint64_t rounds = passes * steps;

    uint64_t start = hvmm_rdtsc(), touches = 0, streamed = 0;
    for (uint64_t r = 1; r <= rounds; r++) {
        uint64_t step = (r - 1) % steps;
        struct hvmm_free_iter it;
        uint64_t addr, len;
        hvmm_free_iter_init(&it, info, hot_bytes + s.off + step * CHUNK,
                            s.len ? CHUNK : 0);
        while (hvmm_free_iter_next(&it, &addr, &len)) {
            uint64_t *p = (uint64_t *)addr, *end = p + len / 8;
            for (; p < end; p++)
                *p = (uint64_t)p ^ pass_key(r);
            streamed += len;
        }
        for (uint64_t i = 0; i < mine; i++) {
            uint64_t k = vcpu + i * n;
            uint64_t page = (k * 37) % CHUNK_PAGES;
            uint64_t a = hvmm_free_addr(info, k * CHUNK + page * PAGE_SIZE);
            volatile uint64_t *w = (volatile uint64_t *)a;
            uint64_t want = hot_value(a, r - 1);
            uint64_t found = *w;
            if (found != want) {
                hvmm_printf("mixed: MISMATCH vcpu=%u addr=0x%lx expected=0x%lx "
                            "found=0x%lx\n",
                            vcpu, a, want, found);
                return 1;
            }
            *w = hot_value(a, r);
            touches++;
        }
    }
    uint64_t cycles = hvmm_rdtsc() - start;

    hvmm_printf("mixed vcpu=%u bytes=%lu rounds=%lu hot_touches=%lu cycles=%lu ok\n",
                vcpu, (uint64_t)(streamed + touches * PAGE_SIZE), rounds, touches, cycles);
    return 0;
}
