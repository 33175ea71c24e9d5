/*
 * common.h - helpers shared by the built-in payloads (not part of the SDK).
 */
#ifndef PAYLOADS_COMMON_H
#define PAYLOADS_COMMON_H

#include "hvmm.h"

#define PAGE_SIZE 4096ull

/* The most passes= a payload takes: far more than any run needs (a pass
 * over 1 GiB takes a second or more), and small enough that counts derived
 * from it cannot wrap. */
#define MAX_PASSES 1000000ull

/* splitmix64 finalizer: a cheap, well-mixing bijection on 64-bit values. */
static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* floor(a * b / 2^64): maps a uniform 64-bit a onto [0, b). */
static inline uint64_t mul_hi(uint64_t a, uint64_t b)
{
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
}

/* The vCPU count, never 0. */
static inline unsigned vcpu_count(const struct hvmm_boot_info *info)
{
    return info->vcpu_count != 0 ? info->vcpu_count : 1;
}

/*
 * Checks the working-set size against the free RAM. Returns 0 if it fits;
 * otherwise prints a message (if report) and returns -1.
 */
static inline int check_bytes(const char *prog, uint64_t bytes,
                              uint64_t free_bytes, int report)
{
    if (bytes <= free_bytes)
        return 0;
    if (report)
        hvmm_printf("%s: bytes=%lu is more than the free RAM "
                    "(free_bytes=%lu)\n",
                    prog, bytes, free_bytes);
    return -1;
}

/* A vCPU's part of the working set, as a free-space interval. */
struct share {
    uint64_t off;
    uint64_t len;
};

/*
 * Splits `bytes` (a multiple of 8) evenly over `n` vCPUs: every share is a
 * multiple of 4 KiB except the last vCPU's, which takes the remainder.
 */
static inline struct share vcpu_share(uint64_t bytes, unsigned n, unsigned i)
{
    uint64_t each = (bytes / n) & ~(PAGE_SIZE - 1);
    struct share s = { each * i, each };
    if (i == n - 1)
        s.len = bytes - each * i;
    return s;
}

/* The key of pass p: the word at address a is written as a ^ pass_key(p). */
static inline uint64_t pass_key(uint64_t p)
{
    return p * 0x9e3779b97f4a7c15ull;
}

/*
 * A pseudo-random permutation of [0, n): a 4-round Feistel network on the
 * smallest even number of bits covering n, with cycle walking (re-encrypt
 * until the value is below n). Each Feistel round is invertible, so this is
 * a bijection for any n; the domain is < 4n, so few walks are needed.
 */
struct perm {
    uint64_t n;
    unsigned half; /* bits per Feistel half */
    uint64_t mask; /* (1 << half) - 1 */
    uint64_t keys[4];
};

static inline void perm_init(struct perm *p, uint64_t n, uint64_t key)
{
    unsigned bits = 2;
    while (bits < 62 && (1ull << bits) < n)
        bits += 2;
    p->n = n;
    p->half = bits / 2;
    p->mask = (1ull << p->half) - 1;
    for (unsigned r = 0; r < 4; r++)
        p->keys[r] = mix64(key + r + 1);
}

static inline uint64_t perm_at(const struct perm *p, uint64_t i)
{
    uint64_t x = i;
    do {
        uint64_t l = x >> p->half, r = x & p->mask;
        for (unsigned k = 0; k < 4; k++) {
            uint64_t t = l ^ (mix64(r ^ p->keys[k]) & p->mask);
            l = r;
            r = t;
        }
        x = (l << p->half) | r;
    } while (x >= p->n);
    return x;
}

/*
 * The inverse of perm_at: perm_inv(p, perm_at(p, i)) == i. The rounds run
 * backwards; walking backwards from a value below n passes the same
 * out-of-range values the forward walk passed, so it stops at i.
 */
static inline uint64_t perm_inv(const struct perm *p, uint64_t y)
{
    uint64_t x = y;
    do {
        uint64_t l = x >> p->half, r = x & p->mask;
        for (unsigned k = 4; k-- > 0;) {
            uint64_t t = r ^ (mix64(l ^ p->keys[k]) & p->mask);
            r = l;
            l = t;
        }
        x = (l << p->half) | r;
    } while (x >= p->n);
    return x;
}

/* splitmix64: a per-vCPU generator whose state lives on the caller's
 * stack (globals are shared by all vCPUs). */
static inline uint64_t splitmix_next(uint64_t *state)
{
    *state += 0x9e3779b97f4a7c15ull;
    return mix64(*state);
}

/*
 * The free-space offset at which a working set of need_bytes starts on a
 * 2 MiB-aligned guest address, so that its 2 MiB pieces are the VMM's
 * chunks (free ranges other than the first start and end on 2 MiB
 * boundaries); 0 when the aligned placement does not fit.
 */
static inline uint64_t chunk_lead(const struct hvmm_boot_info *info,
                                  uint64_t need_bytes, uint64_t free_bytes)
{
    const uint64_t chunk = 2ull << 20;
    uint64_t first_free = info->range_count ? info->ranges[0].start : 0;
    uint64_t lead = ((first_free + chunk - 1) & ~(chunk - 1)) - first_free;
    if (lead > free_bytes || need_bytes > free_bytes - lead)
        return 0;
    return lead;
}

#endif /* PAYLOADS_COMMON_H */
