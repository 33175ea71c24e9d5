/*
 * hvmm.h - the hugevmm payload SDK.
 *
 * A payload is a freestanding 64-bit program that hugevmm runs on every
 * vCPU at CPL 3 with interrupts off (see docs/PAYLOAD_PROTOCOL.md). Write
 *
 *     int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info);
 *
 * and link it with start.S, hvmm.c and hvmm.ld (see README.md in this
 * directory for the gcc command line). start.S checks the boot info, calls
 * hvmm_main on every vCPU and reports its return value as the exit status.
 * start.S also carries the ELF note that opts the payload in to protocol
 * version 2 (virtio-mmio devices, see hvmm_mmio_devices and virtio.h).
 *
 * Rules for payload code:
 *   - no libc: use the functions below (memset/memcpy/memmove/memcmp exist
 *     because gcc may emit calls to them);
 *   - no syscall/sysenter/int/hlt or privileged instructions, no TLS
 *     (%fs and %gs have base 0) and no stack protector;
 *   - SSE is usable, AVX is not;
 *   - every vCPU runs the same code on its own 24 KiB stack, and global
 *     variables are shared by all vCPUs: keep per-vCPU state on the stack.
 */
#ifndef HVMM_H
#define HVMM_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------------- */
/* Boot info (protocol versions 1 and 2)                                   */
/* ---------------------------------------------------------------------- */

#define HVMM_BOOT_MAGIC   0x4c5941504d4d5648ull /* "HVMMPAYL" */
/* The highest protocol version the SDK speaks: the value of the ELF note
 * in start.S. The VMM writes min(note, 2) into the boot info, so a payload
 * built with this SDK sees version 2 on a VMM that knows it and version 1
 * (no device list) on an older one; start.S accepts both. */
#define HVMM_BOOT_VERSION     2u
#define HVMM_BOOT_VERSION_MIN 1u

/* I/O ports served by the VMM. */
#define HVMM_PORT_CONSOLE 0x3f8 /* outb: one byte of console output */
#define HVMM_PORT_EXIT    0xf4  /* outl: this vCPU is done, with status */

/* One free guest-RAM range [start, end), 4 KiB aligned. */
struct hvmm_range {
    uint64_t start;
    uint64_t end;
};

/* The boot info block the VMM passes in %rsi. */
struct hvmm_boot_info {
    uint64_t magic;             /* HVMM_BOOT_MAGIC */
    uint32_t version;           /* 1 or 2 (HVMM_BOOT_VERSION) */
    uint32_t vcpu_count;        /* number of vCPUs running the payload */
    uint64_t ram_bytes;         /* guest RAM size (--mem) */
    uint64_t arg_ptr;           /* guest address of the argument string */
    uint64_t arg_len;           /* its length; it is NOT NUL-terminated */
    uint64_t range_count;       /* number of entries in ranges[] */
    struct hvmm_range ranges[]; /* free RAM, in address order */
    /* Version 2 only, after ranges[range_count]: uint64_t mmio_count, then
     * mmio_count struct hvmm_mmio. Use hvmm_mmio_devices(). */
};

/* Version 2: one virtio-mmio device window, identity-mapped uncached for
 * user access. Identify the device by its DeviceID register (virtio.h). */
struct hvmm_mmio {
    uint64_t base;       /* guest-physical (= virtual) address of the window */
    uint64_t size_bytes; /* window size (4 KiB) */
    uint32_t irq;        /* interrupt line (interrupts stay off: poll) */
    uint32_t reserved;
};

_Static_assert(offsetof(struct hvmm_boot_info, version) == 8, "layout");
_Static_assert(offsetof(struct hvmm_boot_info, vcpu_count) == 12, "layout");
_Static_assert(offsetof(struct hvmm_boot_info, ram_bytes) == 16, "layout");
_Static_assert(offsetof(struct hvmm_boot_info, arg_ptr) == 24, "layout");
_Static_assert(offsetof(struct hvmm_boot_info, arg_len) == 32, "layout");
_Static_assert(offsetof(struct hvmm_boot_info, range_count) == 40, "layout");
_Static_assert(offsetof(struct hvmm_boot_info, ranges) == 48, "layout");
_Static_assert(sizeof(struct hvmm_range) == 16, "layout");
_Static_assert(sizeof(struct hvmm_mmio) == 24, "layout");
_Static_assert(offsetof(struct hvmm_mmio, irq) == 16, "layout");

/* The virtio-mmio device windows, in command-line order (--disk before
 * --balloon). Sets *count (0 for version-1 boot info, which has no device
 * list) and returns the first entry (NULL when *count is 0). */
const struct hvmm_mmio *hvmm_mmio_devices(const struct hvmm_boot_info *info,
                                          uint64_t *count);

/* The payload's entry point, written by the user. The return value is the
 * vCPU's exit status. */
int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info);

/* ---------------------------------------------------------------------- */
/* CPU helpers                                                             */
/* ---------------------------------------------------------------------- */

static inline void hvmm_outb(uint16_t port, uint8_t v)
{
    __asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port));
}

static inline void hvmm_outl(uint16_t port, uint32_t v)
{
    __asm__ volatile("outl %0, %1" : : "a"(v), "Nd"(port));
}

/* Time stamp counter (CR4.TSD is clear, so rdtsc works at CPL 3). */
static inline uint64_t hvmm_rdtsc(void)
{
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}

/* Compiler barrier: memory accesses are not moved or dropped across it. */
static inline void hvmm_barrier(void)
{
    __asm__ volatile("" : : : "memory");
}

/* Ends this vCPU with `status` (outl to port 0xf4). Never returns. */
__attribute__((noreturn)) void hvmm_exit(uint32_t status);

/* ---------------------------------------------------------------------- */
/* Console output (port 0x3f8; the VMM prints whole lines)                 */
/* ---------------------------------------------------------------------- */

void hvmm_putc(char c);
/* Writes the NUL-terminated string s; unlike puts(3) adds no newline. */
void hvmm_puts(const char *s);
/* Writes len bytes from s. */
void hvmm_write(const char *s, uint64_t len);
void hvmm_put_u64(uint64_t v); /* decimal */
void hvmm_put_hex(uint64_t v); /* lower-case hex, "0x" prefix */

/*
 * Minimal printf. Conversions: %d %i %u %x %X %c %s %p %%, length
 * modifiers l, ll and z, the '0' flag with a field width (e.g. %016lx),
 * and a precision for strings (%.*s takes an int length, handy for the
 * non-NUL-terminated argument string).
 */
__attribute__((format(printf, 1, 2))) void hvmm_printf(const char *fmt, ...);
void hvmm_vprintf(const char *fmt, va_list ap);

/* ---------------------------------------------------------------------- */
/* Arguments: `key=value` words separated by spaces                        */
/* ---------------------------------------------------------------------- */

/* A string that is not NUL-terminated (e.g. a slice of the arguments). */
struct hvmm_str {
    const char *ptr;
    uint64_t len;
};

/* Result of the hvmm_arg_* lookups. */
#define HVMM_ARG_FOUND  1  /* present and well formed; *out was set */
#define HVMM_ARG_ABSENT 0  /* not given; *out is untouched */
#define HVMM_ARG_BAD    -1 /* present but malformed; *out is untouched */

/* Looks up `key` (without '='). When a key is given more than once, the
 * last word wins. A word without '=' is a key with an empty value. */
int hvmm_arg_str(const struct hvmm_boot_info *info, const char *key,
                 struct hvmm_str *out);
/* A number: decimal, or hexadecimal with a 0x prefix. */
int hvmm_arg_u64(const struct hvmm_boot_info *info, const char *key,
                 uint64_t *out);
/* A byte size, written as hugevmm's own options take them (`--mem`):
 * a decimal number with an optional unit K, M, G or T (case-insensitive,
 * powers of 1024), optionally followed by B or iB, or a lone B (bytes).
 * A decimal fraction is accepted when it makes a whole number of bytes:
 * 1.5M is 1572864, 0.5K is 512, 1.3K is refused. No hex: 0x is for
 * numbers. */
int hvmm_arg_size(const struct hvmm_boot_info *info, const char *key,
                  uint64_t *out);

/* Parses s as a number (hvmm_arg_u64 syntax) or a size; 0 on success. */
int hvmm_parse_u64(struct hvmm_str s, uint64_t *out);
int hvmm_parse_size(struct hvmm_str s, uint64_t *out);

/* 1 if s equals the NUL-terminated string lit, else 0. */
int hvmm_str_eq(struct hvmm_str s, const char *lit);

/* One entry of an argument table for hvmm_parse_args. */
enum hvmm_arg_type {
    HVMM_ARG_NUMBER, /* out is a uint64_t * */
    HVMM_ARG_SIZE,   /* out is a uint64_t * */
    HVMM_ARG_STRING, /* out is a struct hvmm_str * */
};
struct hvmm_arg_spec {
    const char *key; /* without '='; a NULL key ends the table */
    enum hvmm_arg_type type;
    void *out; /* preset it to the default; written only if the key is given */
    /* NUMBER and SIZE: when `ranged` is non-zero, a value outside
     * [min, max] is refused, naming the range. Write HVMM_ARG_RANGE(lo, hi)
     * (or HVMM_ARG_ANY) after `out`; a spec that leaves them out (0)
     * takes any value. */
    uint64_t min;
    uint64_t max;
    int ranged;
};

/* The accepted values [lo, hi] of a NUMBER or SIZE spec:
 *     { "passes", HVMM_ARG_NUMBER, &passes, HVMM_ARG_RANGE(1, 1000) },  */
#define HVMM_ARG_RANGE(lo, hi) (lo), (hi), 1
/* Every value (a seed, a string): the same as leaving the range out. */
#define HVMM_ARG_ANY 0, UINT64_MAX, 1
/* The entry that ends a table. */
#define HVMM_ARG_END { NULL, 0, NULL, 0, 0, 0 }

/*
 * Parses every argument word against `specs`. Returns 0 on success, -1 on
 * an unknown key, a malformed value or one out of its range; then, if
 * `report` is non-zero, it prints one line such as
 *     seqwrite: unknown argument 'foo'; known: bytes= passes=
 *     seqwrite: bad value 'x' for bytes= (expected a size ...); known: ...
 *     hostile: bad value '2' for exceptions= (expected 0 or 1); known: ...
 * (`prog` names the payload). Pass report = (vcpu == 0) to print once.
 * After -1 the words before the bad one may have set their `out`s: do
 * not run then.
 */
int hvmm_parse_args(const struct hvmm_boot_info *info, const char *prog,
                    const struct hvmm_arg_spec *specs, int report);

/* ---------------------------------------------------------------------- */
/* Free RAM                                                                */
/* ---------------------------------------------------------------------- */

/*
 * The free ranges, concatenated in address order, form the "free space";
 * a free-space offset names a byte of it. Payloads split work by offset.
 */

/* Total free bytes (sum of all ranges). */
uint64_t hvmm_free_bytes(const struct hvmm_boot_info *info);

/* Guest address of free-space offset off, or 0 if off is past the end.
 * Cost: linear in the number of ranges. */
uint64_t hvmm_free_addr(const struct hvmm_boot_info *info, uint64_t off);

/*
 * Walks the free-space interval [off, off + len) as contiguous guest
 * address segments:
 *
 *     struct hvmm_free_iter it;
 *     uint64_t addr, n;
 *     hvmm_free_iter_init(&it, info, off, len);
 *     while (hvmm_free_iter_next(&it, &addr, &n))
 *         work((void *)addr, n);
 *
 * The part of the interval beyond the free space is silently dropped.
 */
struct hvmm_free_iter {
    const struct hvmm_boot_info *info;
    uint64_t range; /* index of the current range */
    uint64_t skip;  /* offset still to skip before the first segment */
    uint64_t left;  /* bytes still to return */
};
void hvmm_free_iter_init(struct hvmm_free_iter *it,
                         const struct hvmm_boot_info *info, uint64_t off,
                         uint64_t len);
/* Returns 1 and the next segment, or 0 when the interval is exhausted. */
int hvmm_free_iter_next(struct hvmm_free_iter *it, uint64_t *addr,
                        uint64_t *len);

/* ---------------------------------------------------------------------- */
/* Memory functions (gcc may emit calls to these)                          */
/* ---------------------------------------------------------------------- */

void *memset(void *dst, int c, size_t n);
void *memcpy(void *dst, const void *src, size_t n);
void *memmove(void *dst, const void *src, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t hvmm_strlen(const char *s);

#endif /* HVMM_H */
