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

#endif /* PAYLOADS_COMMON_H */
