/*
 * kv - a key-value store under a YCSB-B-like load: objects placed by hash
 * over the whole heap, skewed popularity, 95 % reads that check the whole
 * object, 5 % updates that version it.
 *
 * Arguments:
 *   heap=SIZE     the heap of objects (default 512M), whole objects; heap
 *                 and the version table (4 bytes per object) must fit in
 *                 free RAM
 *   object=BYTES  object size, a power of two from 64 to 4096 (default 1024)
 *   ops=N         operations per vCPU after the load, 0 to 10^12
 *                 (default 5000000)
 *   reads=PERCENT share of the operations that are reads, 0 to 100
 *                 (default 95); the rest are updates
 *   theta=X       Zipf exponent, a decimal from 0 to 2 with at most three
 *                 places (default 0.99, YCSB's); 0 is uniform
 *   check=0|1     after the operations, check every object (default 1)
 *   lose=N        vCPU 0's Nth update is lost: the version table is bumped
 *                 but the object keeps its old contents, the failure the
 *                 checks exist for; the run must then exit 1 (default 0:
 *                 off)
 *   seed=N        varies the placement and the operations (default 1)
 *
 * Objects: the heap holds N = heap / object slots and N objects, keys 0 to
 * N-1. Key k lives at slot perm(k), a Feistel permutation of [0, N) (see
 * perm_at in common.h), so consecutive keys, and with them the hottest
 * ones, are scattered over every 2 MiB chunk of the heap. An object holds
 * its key (word 0), its version (word 1) and, in every other 8-byte word,
 * a pattern derived from (key, version, seed, word index). The version
 * table (after the heap) holds each key's current version.
 *
 * vCPUs never race on an object: vCPU v owns the keys k with k mod n = v.
 * Load: every vCPU walks the slots in address order and writes its own
 * objects at version 0. Operations: each vCPU draws a rank r from a
 * Zipf-like distribution over its M own keys (probability of rank r
 * proportional to (r + 1)^-theta) and works on key v + r * n; a read
 * checks every word of the object against the table's version, an update
 * bumps the version and rewrites the whole object. Check (check=1): every
 * vCPU walks the slots again and checks each of its objects.
 *
 * Skew: with the defaults on 2 vCPUs (M = 262144 keys each, theta 0.99),
 * about 63 % of the operations touch the hottest 1 % of the objects and
 * 81 % the hottest 10 %; uniform (theta=0) gives 1 % and 10 %. Each vCPU
 * counts its operations on its hottest 1 % (hot1pct_ops=), so a run shows
 * the figure it got.
 *
 * The generator is integer-only (payloads have no libm): ranks 0 to 14
 * are drawn with their own weights, and each octave [2^b, 2^(b+1)) of r + 1
 * above is cut into 16 equal buckets, each weighted as its width times the
 * weight at its centre and drawn uniformly inside; the density changes by
 * at most 6 % across a bucket. Weights are computed with fixed-point log2
 * and exp2.
 *
 * Output, one line per vCPU:
 *   kv vcpu=<i> objects=<M> ops=<o> reads=<r> updates=<u>
 *   hot1pct_ops=<h> load_cycles=<c> ops_cycles=<c> check_cycles=<c> ok
 * or, on the first wrong word (exit 1):
 *   kv: MISMATCH vcpu=<i> in=ops|check key=<k> slot=<s> addr=0x<a>
 *   expected_version=<v> found_version=<w> found_key=<k'> word=<j>
 *   expected=0x<e> found=0x<f>
 * where found_version and found_key are the object's words 1 and 0, and
 * word is the index of the first wrong word.
 */
#include "common.h"

#define MIN_OBJECT 64ull
#define MAX_OBJECT 4096ull
#define MAX_OPS 1000000000000ull
#define MAX_THETA_MILLI 2000ull

/* ---------------------------------------------------------------------- */
/* Fixed-point log2 and exp2                                               */
/* ---------------------------------------------------------------------- */

#define Q32 (1ull << 32)

/* log2(x) in Q32 for x >= 1, to within a few units of 2^-32. */
static uint64_t log2_q32(uint64_t x)
{
    unsigned ip = 63 - (unsigned)__builtin_clzll(x);
    /* x / 2^ip in Q32: in [1, 2). */
    uint64_t y = ip >= 32 ? x >> (ip - 32) : x << (32 - ip);
    uint64_t frac = 0;
    for (unsigned bit = 32; bit-- > 0;) {
        y = (uint64_t)(((unsigned __int128)y * y) >> 32);
        if (y >= 2 * Q32) {
            y >>= 1;
            frac |= 1ull << bit;
        }
    }
    return ((uint64_t)ip << 32) | frac;
}

/* 2^(e / 2^32) for 0 <= e < 63 * 2^32, rounded down. */
static uint64_t exp2_q32(uint64_t e)
{
    /* ln 2 in Q62. */
    const uint64_t ln2_q62 = 0x2c5c85fdf473de6aull;
    unsigned ip = (unsigned)(e >> 32);
    uint64_t f = e & (Q32 - 1);
    /* 2^f = e^(f ln 2) by its series, in Q62: t < 0.7, 24 terms are
     * far more than 62 bits need. */
    uint64_t t = (uint64_t)(((unsigned __int128)f * ln2_q62) >> 32);
    uint64_t sum = 1ull << 62, term = 1ull << 62;
    for (unsigned k = 1; k < 24 && term != 0; k++) {
        term = (uint64_t)(((unsigned __int128)term * t) >> 62) / k;
        sum += term;
    }
    return sum >> (62 - ip);
}

/* ---------------------------------------------------------------------- */
/* Zipf-like ranks                                                         */
/* ---------------------------------------------------------------------- */

/* Ranks 0..14 (x = r + 1 = 1..15) alone, then 16 buckets per octave
 * [2^b, 2^(b+1)) of x for b = 4..40: ranks up to 2^41, more than a guest
 * of 64-byte objects can hold per vCPU. */
#define ZIPF_SINGLE 15u
#define ZIPF_PER_OCTAVE 16u
#define ZIPF_LAST_OCTAVE 40u
#define ZIPF_BUCKETS (ZIPF_SINGLE + ZIPF_PER_OCTAVE * (ZIPF_LAST_OCTAVE - 3))

/* The largest bucket weight is 2^ZIPF_TOP_BITS: the sum of all weights
 * stays below 2^63. */
#define ZIPF_TOP_BITS 52u

struct zipf {
    uint64_t m;                 /* ranks 0..m-1 */
    unsigned buckets;           /* used entries of cum[] */
    uint64_t total;             /* cum[buckets - 1] */
    uint64_t cum[ZIPF_BUCKETS]; /* inclusive prefix sums of the weights */
};

/* Bucket i covers x = r + 1 in [*first, *first + *width), cut at m; 0 when
 * the bucket lies past m. */
static int zipf_bucket(uint64_t m, unsigned i, uint64_t *first, uint64_t *width)
{
    if (i < ZIPF_SINGLE) {
        *first = i + 1;
        *width = 1;
    } else {
        unsigned b = 4 + (i - ZIPF_SINGLE) / ZIPF_PER_OCTAVE;
        uint64_t w = 1ull << (b - 4);
        *first = (1ull << b) + (uint64_t)((i - ZIPF_SINGLE) % ZIPF_PER_OCTAVE) * w;
        *width = w;
    }
    if (*first > m)
        return 0;
    if (*first + *width > m + 1)
        *width = m + 1 - *first;
    return 1;
}

/*
 * log2 of a bucket's weight, width * centre^-theta, in Q32 plus 2^40 so
 * that it stays positive. The centre of the integers first..first+width-1
 * is (2 first + width - 1) / 2.
 */
static uint64_t zipf_log_weight(uint64_t first, uint64_t width, uint64_t theta_milli)
{
    uint64_t log_centre = log2_q32(2 * first + width - 1) - Q32;
    return (1ull << 40) + log2_q32(width) - log_centre * theta_milli / 1000;
}

/* m >= 1 ranks, at most 2^41. */
static void zipf_init(struct zipf *z, uint64_t m, uint64_t theta_milli)
{
    uint64_t first, width, top = 0;
    unsigned n = 0;
    while (n < ZIPF_BUCKETS && zipf_bucket(m, n, &first, &width)) {
        uint64_t log_weight = zipf_log_weight(first, width, theta_milli);
        if (log_weight > top)
            top = log_weight;
        n++;
    }
    const uint64_t top_q32 = (uint64_t)ZIPF_TOP_BITS << 32;
    uint64_t sum = 0;
    for (unsigned i = 0; i < n; i++) {
        zipf_bucket(m, i, &first, &width);
        uint64_t below = top - zipf_log_weight(first, width, theta_milli);
        sum += below >= top_q32 ? 0 : exp2_q32(top_q32 - below);
        z->cum[i] = sum;
    }
    z->m = m;
    z->buckets = n;
    z->total = sum;
}

/* A rank in [0, m). */
static uint64_t zipf_next(const struct zipf *z, uint64_t *rng)
{
    uint64_t u = mul_hi(splitmix_next(rng), z->total);
    /* The first bucket whose prefix sum exceeds u (empty buckets, whose
     * weight underflowed, are never chosen). */
    unsigned lo = 0, hi = z->buckets - 1;
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        if (z->cum[mid] > u)
            hi = mid;
        else
            lo = mid + 1;
    }
    uint64_t first, width;
    zipf_bucket(z->m, lo, &first, &width);
    return first - 1 + mul_hi(splitmix_next(rng), width);
}

/* ---------------------------------------------------------------------- */
/* Objects                                                                 */
/* ---------------------------------------------------------------------- */

struct heap {
    const struct hvmm_boot_info *info;
    uint64_t lead;         /* free-space offset of slot 0 */
    uint64_t object_bytes;
    uint64_t table_off;    /* free-space offset of the version table */
    uint64_t seed_key;
};

static uint64_t slot_addr(const struct heap *h, uint64_t slot)
{
    return hvmm_free_addr(h->info, h->lead + slot * h->object_bytes);
}

static volatile uint32_t *version_of(const struct heap *h, uint64_t key)
{
    return (volatile uint32_t *)hvmm_free_addr(h->info, h->table_off + key * 4);
}

/* The pattern's base for (key, version). */
static uint64_t object_base(const struct heap *h, uint64_t key, uint64_t version)
{
    return mix64(mix64(key ^ h->seed_key) + version * 0xd1b54a32d192ed03ull);
}

/* Word j (>= 2) of an object with pattern base `base`. */
static uint64_t object_word(uint64_t base, uint64_t j)
{
    return (base ^ j) * 0x9e3779b97f4a7c15ull;
}

static void object_write(const struct heap *h, uint64_t addr, uint64_t key,
                         uint64_t version)
{
    uint64_t *w = (uint64_t *)addr, words = h->object_bytes / 8;
    uint64_t base = object_base(h, key, version);
    w[0] = key;
    w[1] = version;
    for (uint64_t j = 2; j < words; j++)
        w[j] = object_word(base, j);
}

/* Checks an object; on a wrong word prints the mismatch and returns -1. */
static int object_check(const struct heap *h, unsigned vcpu, const char *phase,
                        uint64_t key, uint64_t slot, uint64_t version)
{
    uint64_t addr = slot_addr(h, slot);
    const volatile uint64_t *w = (const volatile uint64_t *)addr;
    uint64_t words = h->object_bytes / 8;
    uint64_t base = object_base(h, key, version);
    uint64_t bad = words, want = 0, found = 0;
    if (w[0] != key) {
        bad = 0;
        want = key;
    } else if (w[1] != version) {
        bad = 1;
        want = version;
    } else {
        for (uint64_t j = 2; j < words; j++) {
            want = object_word(base, j);
            if (w[j] != want) {
                bad = j;
                break;
            }
        }
    }
    if (bad == words)
        return 0;
    found = w[bad];
    hvmm_printf("kv: MISMATCH vcpu=%u in=%s key=%lu slot=%lu addr=0x%lx "
                "expected_version=%lu found_version=%lu found_key=%lu word=%lu "
                "expected=0x%lx found=0x%lx\n",
                vcpu, phase, key, slot, addr, version, (uint64_t)w[1],
                (uint64_t)w[0], bad, want, found);
    return -1;
}

/* ---------------------------------------------------------------------- */
/* Arguments                                                               */
/* ---------------------------------------------------------------------- */

/* theta=: a decimal with at most three places, in thousandths. */
static int parse_milli(struct hvmm_str s, uint64_t *out)
{
    uint64_t whole = 0, frac = 0;
    unsigned i = 0, places = 0, digits = 0;
    for (; i < s.len && s.ptr[i] >= '0' && s.ptr[i] <= '9'; i++, digits++) {
        if (whole > MAX_THETA_MILLI)
            return -1;
        whole = whole * 10 + (uint64_t)(s.ptr[i] - '0');
    }
    if (digits == 0)
        return -1;
    if (i < s.len && s.ptr[i] == '.') {
        for (i++; i < s.len && s.ptr[i] >= '0' && s.ptr[i] <= '9'; i++) {
            if (++places > 3)
                return -1;
            frac = frac * 10 + (uint64_t)(s.ptr[i] - '0');
        }
        if (places == 0)
            return -1;
    }
    if (i != s.len)
        return -1;
    while (places++ < 3)
        frac *= 10;
    *out = whole * 1000 + frac;
    return 0;
}

int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info)
{
    uint64_t free_bytes = hvmm_free_bytes(info);
    uint64_t heap_bytes = 512ull << 20, object_bytes = 1024, ops = 5000000;
    uint64_t reads = 95, check = 1, lose = 0, seed = 1;
    struct hvmm_str theta_arg = { "0.99", 4 };
    const struct hvmm_arg_spec specs[] = {
        { "heap", HVMM_ARG_SIZE, &heap_bytes, HVMM_ARG_ANY }, /* checked below */
        { "object", HVMM_ARG_NUMBER, &object_bytes,
          HVMM_ARG_RANGE(MIN_OBJECT, MAX_OBJECT) },
        { "ops", HVMM_ARG_NUMBER, &ops, HVMM_ARG_RANGE(0, MAX_OPS) },
        { "reads", HVMM_ARG_NUMBER, &reads, HVMM_ARG_RANGE(0, 100) },
        { "theta", HVMM_ARG_STRING, &theta_arg, HVMM_ARG_ANY },
        { "check", HVMM_ARG_NUMBER, &check, HVMM_ARG_RANGE(0, 1) },
        { "lose", HVMM_ARG_NUMBER, &lose, HVMM_ARG_ANY },
        { "seed", HVMM_ARG_NUMBER, &seed, HVMM_ARG_ANY },
        HVMM_ARG_END,
    };
    int report = vcpu == 0;
    if (hvmm_parse_args(info, "kv", specs, report) != 0)
        return 2;
    uint64_t theta_milli;
    if (parse_milli(theta_arg, &theta_milli) != 0 || theta_milli > MAX_THETA_MILLI) {
        if (report)
            hvmm_printf("kv: bad value '%.*s' for theta= (expected a decimal "
                        "from 0 to 2 with at most three places, e.g. 0.99)\n",
                        (int)theta_arg.len, theta_arg.ptr);
        return 2;
    }
    if (object_bytes & (object_bytes - 1)) {
        if (report)
            hvmm_printf("kv: bad value '%lu' for object= (expected a power of "
                        "two from 64 to 4096)\n",
                        object_bytes);
        return 2;
    }
    unsigned n = vcpu_count(info);
    uint64_t slots = heap_bytes / object_bytes;
    if (slots < n) {
        if (report)
            hvmm_printf("kv: heap=%lu holds %lu objects of %lu bytes, fewer "
                        "than the %u vCPUs\n",
                        heap_bytes, slots, object_bytes, n);
        return 2;
    }
    uint64_t used_bytes = slots * object_bytes;
    uint64_t table_bytes = (slots * 4 + 7) & ~7ull;
    if (used_bytes > free_bytes || table_bytes > free_bytes - used_bytes) {
        if (report)
            hvmm_printf("kv: heap=%lu and its version table (%lu bytes) are "
                        "more than the free RAM (free_bytes=%lu)\n",
                        heap_bytes, table_bytes, free_bytes);
        return 2;
    }

    struct heap h = {
        .info = info,
        .lead = chunk_lead(info, used_bytes + table_bytes, free_bytes),
        .object_bytes = object_bytes,
        .seed_key = mix64(seed ^ 0x6b76ull),
    };
    h.table_off = h.lead + used_bytes;
    struct perm place;
    perm_init(&place, slots, mix64(seed));

    /* Keys vcpu, vcpu + n, ...: key vcpu + r * n has rank r here. */
    uint64_t mine = (slots - vcpu + n - 1) / n;
    uint64_t hot_ranks = mine / 100 ? mine / 100 : 1;
    struct zipf z;
    zipf_init(&z, mine, theta_milli);
    uint64_t rng = mix64(seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)vcpu << 32 | 0x4b56));

    uint64_t t0 = hvmm_rdtsc();
    for (uint64_t s = 0; s < slots; s++) {
        uint64_t key = perm_inv(&place, s);
        if (key % n != vcpu)
            continue;
        object_write(&h, slot_addr(&h, s), key, 0);
        *version_of(&h, key) = 0;
    }
    uint64_t t1 = hvmm_rdtsc();

    uint64_t done_reads = 0, updates = 0, hot = 0;
    for (uint64_t i = 0; i < ops; i++) {
        uint64_t rank = zipf_next(&z, &rng);
        uint64_t key = vcpu + rank * n;
        uint64_t slot = perm_at(&place, key);
        volatile uint32_t *version = version_of(&h, key);
        hot += rank < hot_ranks;
        if (mul_hi(splitmix_next(&rng), 100) < reads) {
            if (object_check(&h, vcpu, "ops", key, slot, *version) != 0)
                return 1;
            done_reads++;
        } else {
            uint32_t next = *version + 1;
            updates++;
            if (!(vcpu == 0 && updates == lose))
                object_write(&h, slot_addr(&h, slot), key, next);
            *version = next;
        }
    }
    uint64_t t2 = hvmm_rdtsc();

    if (check) {
        for (uint64_t s = 0; s < slots; s++) {
            uint64_t key = perm_inv(&place, s);
            if (key % n != vcpu)
                continue;
            if (object_check(&h, vcpu, "check", key, s, *version_of(&h, key)) != 0)
                return 1;
        }
    }
    uint64_t t3 = hvmm_rdtsc();

    hvmm_printf("kv vcpu=%u objects=%lu ops=%lu reads=%lu updates=%lu "
                "hot1pct_ops=%lu load_cycles=%lu ops_cycles=%lu "
                "check_cycles=%lu ok\n",
                vcpu, mine, ops, done_reads, updates, hot, t1 - t0, t2 - t1,
                t3 - t2);
    return 0;
}
