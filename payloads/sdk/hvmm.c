/*
 * hvmm.c - the hugevmm payload SDK runtime (see hvmm.h).
 *
 * Nothing here keeps mutable global state: every vCPU runs this code at the
 * same time.
 */
#include "hvmm.h"

/* ---------------------------------------------------------------------- */
/* Entry (called by _start in start.S)                                     */
/* ---------------------------------------------------------------------- */

int hvmm_start(unsigned vcpu, const struct hvmm_boot_info *info);

int hvmm_start(unsigned vcpu, const struct hvmm_boot_info *info)
{
    if (info == NULL || ((uintptr_t)info & 7) != 0) {
        hvmm_printf("hvmm: vcpu %u: bad boot info pointer %p\n", vcpu,
                    (const void *)info);
        return 2;
    }
    if (info->magic != HVMM_BOOT_MAGIC) {
        hvmm_printf("hvmm: vcpu %u: bad boot info magic 0x%lx at %p "
                    "(expected 0x%llx)\n",
                    vcpu, info->magic, (const void *)info, HVMM_BOOT_MAGIC);
        return 2;
    }
    if (info->version < HVMM_BOOT_VERSION_MIN ||
        info->version > HVMM_BOOT_VERSION) {
        hvmm_printf("hvmm: vcpu %u: boot info version %u, this payload "
                    "speaks versions %u to %u\n",
                    vcpu, info->version, HVMM_BOOT_VERSION_MIN,
                    HVMM_BOOT_VERSION);
        return 2;
    }
    return hvmm_main(vcpu, info);
}

const struct hvmm_mmio *hvmm_mmio_devices(const struct hvmm_boot_info *info,
                                          uint64_t *count)
{
    *count = 0;
    if (info->version < 2)
        return NULL;
    /* u64 mmio_count right after the last free range, then the entries. */
    const uint64_t *mmio_count =
        (const uint64_t *)(const void *)&info->ranges[info->range_count];
    *count = *mmio_count;
    return *count != 0 ? (const struct hvmm_mmio *)(const void *)(mmio_count + 1)
                       : NULL;
}

void hvmm_exit(uint32_t status)
{
    /* The VMM stops the vCPU at the first write; loop in case it does not. */
    for (;;)
        hvmm_outl(HVMM_PORT_EXIT, status);
}

/* ---------------------------------------------------------------------- */
/* Console                                                                 */
/* ---------------------------------------------------------------------- */

void hvmm_putc(char c)
{
    hvmm_outb(HVMM_PORT_CONSOLE, (uint8_t)c);
}

void hvmm_puts(const char *s)
{
    while (*s)
        hvmm_putc(*s++);
}

void hvmm_write(const char *s, uint64_t len)
{
    for (uint64_t i = 0; i < len; i++)
        hvmm_putc(s[i]);
}

/* Formats v in `base` into the end of buf[24]; returns the first digit. */
static char *format_u64(char *buf_end, uint64_t v, unsigned base, int upper)
{
    const char *digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
    char *p = buf_end;
    do {
        *--p = digits[v % base];
        v /= base;
    } while (v != 0);
    return p;
}

void hvmm_put_u64(uint64_t v)
{
    char buf[24];
    char *p = format_u64(buf + sizeof(buf), v, 10, 0);
    hvmm_write(p, (uint64_t)(buf + sizeof(buf) - p));
}

void hvmm_put_hex(uint64_t v)
{
    char buf[24];
    char *p = format_u64(buf + sizeof(buf), v, 16, 0);
    hvmm_puts("0x");
    hvmm_write(p, (uint64_t)(buf + sizeof(buf) - p));
}

/* Writes `len` digits at p, preceded by an optional sign, padded to width. */
static void put_padded(const char *p, int len, int negative, int width,
                       int zero)
{
    int pad = width - len - (negative ? 1 : 0);
    if (!zero)
        for (; pad > 0; pad--)
            hvmm_putc(' ');
    if (negative)
        hvmm_putc('-');
    for (; pad > 0; pad--)
        hvmm_putc('0');
    hvmm_write(p, (uint64_t)len);
}

void hvmm_vprintf(const char *fmt, va_list ap)
{
    for (; *fmt != '\0'; fmt++) {
        if (*fmt != '%') {
            hvmm_putc(*fmt);
            continue;
        }
        fmt++;

        int zero = 0, width = 0, prec = -1, longs = 0;
        if (*fmt == '0') {
            zero = 1;
            fmt++;
        }
        while (*fmt >= '0' && *fmt <= '9')
            width = width * 10 + (*fmt++ - '0');
        if (*fmt == '.') {
            fmt++;
            if (*fmt == '*') {
                prec = va_arg(ap, int);
                fmt++;
            } else {
                prec = 0;
                while (*fmt >= '0' && *fmt <= '9')
                    prec = prec * 10 + (*fmt++ - '0');
            }
        }
        while (*fmt == 'l') {
            longs++;
            fmt++;
        }
        if (*fmt == 'z') {
            longs = 1;
            fmt++;
        }

        char buf[24];
        char *end = buf + sizeof(buf);
        char *p;
        switch (*fmt) {
        case 'd':
        case 'i': {
            int64_t v = longs ? va_arg(ap, long) : va_arg(ap, int);
            uint64_t mag = v < 0 ? -(uint64_t)v : (uint64_t)v;
            p = format_u64(end, mag, 10, 0);
            put_padded(p, (int)(end - p), v < 0, width, zero);
            break;
        }
        case 'u':
        case 'x':
        case 'X': {
            uint64_t v = longs ? va_arg(ap, unsigned long)
                               : va_arg(ap, unsigned int);
            p = format_u64(end, v, *fmt == 'u' ? 10 : 16, *fmt == 'X');
            put_padded(p, (int)(end - p), 0, width, zero);
            break;
        }
        case 'p': {
            uint64_t v = (uintptr_t)va_arg(ap, const void *);
            hvmm_puts("0x");
            p = format_u64(end, v, 16, 0);
            put_padded(p, (int)(end - p), 0, width - 2, zero);
            break;
        }
        case 'c':
            hvmm_putc((char)va_arg(ap, int));
            break;
        case 's': {
            const char *s = va_arg(ap, const char *);
            if (s == NULL)
                s = "(null)";
            int len = 0;
            while ((prec < 0 || len < prec) && s[len] != '\0')
                len++;
            put_padded(s, len, 0, width, 0);
            break;
        }
        case '%':
            hvmm_putc('%');
            break;
        case '\0':
            return; /* a lone '%' at the end */
        default:    /* unknown conversion: show it as is */
            hvmm_putc('%');
            hvmm_putc(*fmt);
            break;
        }
    }
}

void hvmm_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    hvmm_vprintf(fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------------- */
/* Arguments                                                               */
/* ---------------------------------------------------------------------- */

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* One `key=value` word of the argument string. */
struct word {
    struct hvmm_str key;
    struct hvmm_str value; /* empty if the word has no '=' */
};

/* Cursor over the argument words. */
struct words {
    const char *p;
    const char *end;
};

static void words_init(struct words *w, const struct hvmm_boot_info *info)
{
    w->p = (const char *)(uintptr_t)info->arg_ptr;
    w->end = w->p + info->arg_len;
}

static int words_next(struct words *w, struct word *out)
{
    while (w->p < w->end && is_space(*w->p))
        w->p++;
    if (w->p == w->end)
        return 0;
    const char *start = w->p;
    while (w->p < w->end && !is_space(*w->p))
        w->p++;
    const char *eq = start;
    while (eq < w->p && *eq != '=')
        eq++;
    out->key.ptr = start;
    out->key.len = (uint64_t)(eq - start);
    out->value.ptr = eq < w->p ? eq + 1 : w->p;
    out->value.len = (uint64_t)(w->p - out->value.ptr);
    return 1;
}

int hvmm_str_eq(struct hvmm_str s, const char *lit)
{
    uint64_t i = 0;
    for (; i < s.len; i++)
        if (lit[i] == '\0' || lit[i] != s.ptr[i])
            return 0;
    return lit[i] == '\0';
}

int hvmm_parse_u64(struct hvmm_str s, uint64_t *out)
{
    uint64_t v = 0, i = 0;
    unsigned base = 10;
    if (s.len > 2 && s.ptr[0] == '0' && (s.ptr[1] == 'x' || s.ptr[1] == 'X')) {
        base = 16;
        i = 2;
    }
    if (i == s.len)
        return -1;
    for (; i < s.len; i++) {
        char c = s.ptr[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (base == 16 && c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else if (base == 16 && c >= 'A' && c <= 'F')
            d = (unsigned)(c - 'A' + 10);
        else
            return -1;
        if (v > (UINT64_MAX - d) / base)
            return -1; /* overflow */
        v = v * base + d;
    }
    *out = v;
    return 0;
}

static char lower(char c)
{
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

/* The multiplier of a size's unit: "" or "b" is 1, "k", "kb", "kib" 1024,
 * and so on up to "t" (case-insensitive); 0 for anything else. */
static uint64_t unit_bytes(const char *p, uint64_t len)
{
    if (len == 0 || (len == 1 && lower(p[0]) == 'b'))
        return 1;
    unsigned shift;
    switch (lower(p[0])) {
    case 'k': shift = 10; break;
    case 'm': shift = 20; break;
    case 'g': shift = 30; break;
    case 't': shift = 40; break;
    default: return 0;
    }
    int tail_ok = len == 1 || (len == 2 && lower(p[1]) == 'b') ||
                  (len == 3 && lower(p[1]) == 'i' && lower(p[2]) == 'b');
    return tail_ok ? 1ull << shift : 0;
}

/* More fraction digits are refused, as hugevmm's own sizes (guestmem)
 * refuse them. */
#define MAX_FRACTION_DIGITS 20

int hvmm_parse_size(struct hvmm_str s, uint64_t *out)
{
    uint64_t i = 0, whole = 0;
    for (; i < s.len && s.ptr[i] >= '0' && s.ptr[i] <= '9'; i++) {
        unsigned d = (unsigned)(s.ptr[i] - '0');
        if (whole > (UINT64_MAX - d) / 10)
            return -1; /* overflow */
        whole = whole * 10 + d;
    }
    if (i == 0)
        return -1; /* no number (".5K", "K", "-1") */
    uint64_t frac_start = i, frac_end = i;
    if (i < s.len && s.ptr[i] == '.') {
        frac_start = ++i;
        while (i < s.len && s.ptr[i] >= '0' && s.ptr[i] <= '9')
            i++;
        frac_end = i;
        if (frac_end == frac_start)
            return -1; /* "5.K" */
    }
    uint64_t unit = unit_bytes(s.ptr + i, s.len - i);
    if (unit == 0)
        return -1;
    if (whole > UINT64_MAX / unit)
        return -1; /* overflow */
    uint64_t bytes = whole * unit;
    while (frac_end > frac_start && s.ptr[frac_end - 1] == '0')
        frac_end--; /* 2.50M is 2.5M */
    if (frac_end > frac_start) {
        if (frac_end - frac_start > MAX_FRACTION_DIGITS)
            return -1;
        /* 0.d1 d2 ... dn x unit, from the last digit on: y = (dk x unit +
         * y) / 10. When the whole is a whole number of bytes, so is every
         * step (the digits from k on, times unit, are a multiple of
         * 10^(n-k+1) too), so a remainder anywhere means it is not. Each
         * step stays below 10 x unit: no wide division (-nostdlib has no
         * libgcc for it). */
        uint64_t frac_bytes = 0;
        for (uint64_t j = frac_end; j-- > frac_start;) {
            uint64_t t = (uint64_t)(s.ptr[j] - '0') * unit + frac_bytes;
            if (t % 10 != 0)
                return -1; /* not a whole number of bytes: 1.3K */
            frac_bytes = t / 10;
        }
        if (bytes > UINT64_MAX - frac_bytes)
            return -1;
        bytes += frac_bytes;
    }
    *out = bytes;
    return 0;
}

int hvmm_arg_str(const struct hvmm_boot_info *info, const char *key,
                 struct hvmm_str *out)
{
    struct words w;
    struct word word;
    int found = HVMM_ARG_ABSENT;
    words_init(&w, info);
    while (words_next(&w, &word)) {
        if (hvmm_str_eq(word.key, key)) {
            *out = word.value;
            found = HVMM_ARG_FOUND;
        }
    }
    return found;
}

int hvmm_arg_u64(const struct hvmm_boot_info *info, const char *key,
                 uint64_t *out)
{
    struct hvmm_str s;
    int r = hvmm_arg_str(info, key, &s);
    if (r != HVMM_ARG_FOUND)
        return r;
    return hvmm_parse_u64(s, out) == 0 ? HVMM_ARG_FOUND : HVMM_ARG_BAD;
}

int hvmm_arg_size(const struct hvmm_boot_info *info, const char *key,
                  uint64_t *out)
{
    struct hvmm_str s;
    int r = hvmm_arg_str(info, key, &s);
    if (r != HVMM_ARG_FOUND)
        return r;
    return hvmm_parse_size(s, out) == 0 ? HVMM_ARG_FOUND : HVMM_ARG_BAD;
}

static void print_known(const struct hvmm_arg_spec *specs)
{
    hvmm_puts("; known:");
    if (specs[0].key == NULL)
        hvmm_puts(" (none)");
    for (; specs->key != NULL; specs++)
        hvmm_printf(" %s=", specs->key);
    hvmm_putc('\n');
}

/* A size as hugevmm suggests them: the largest unit it is a whole number
 * of (2M, 64K), else bytes. */
static void put_size(uint64_t v)
{
    static const char units[] = "TGMK";
    for (unsigned i = 0; i < 4; i++) {
        unsigned shift = 40 - 10 * i;
        if (v != 0 && (v & ((1ull << shift) - 1)) == 0) {
            hvmm_printf("%lu%c", v >> shift, units[i]);
            return;
        }
    }
    hvmm_put_u64(v);
}

/* The range of a spec in words: "0 or 1", "a number from 1 to 64",
 * "a size from 0 to 6M". */
static void put_range(const struct hvmm_arg_spec *spec)
{
    if (spec->type == HVMM_ARG_NUMBER && spec->max == spec->min + 1) {
        hvmm_printf("%lu or %lu", spec->min, spec->max);
        return;
    }
    int size = spec->type == HVMM_ARG_SIZE;
    hvmm_puts(size ? "a size from " : "a number from ");
    if (size)
        put_size(spec->min);
    else
        hvmm_put_u64(spec->min);
    hvmm_puts(" to ");
    if (size)
        put_size(spec->max);
    else
        hvmm_put_u64(spec->max);
}

int hvmm_parse_args(const struct hvmm_boot_info *info, const char *prog,
                    const struct hvmm_arg_spec *specs, int report)
{
    struct words w;
    struct word word;
    words_init(&w, info);
    while (words_next(&w, &word)) {
        const struct hvmm_arg_spec *spec = specs;
        while (spec->key != NULL && !hvmm_str_eq(word.key, spec->key))
            spec++;
        if (spec->key == NULL) {
            if (report) {
                hvmm_printf("%s: unknown argument '%.*s'", prog,
                            (int)word.key.len, word.key.ptr);
                print_known(specs);
            }
            return -1;
        }

        const char *expected = NULL;
        uint64_t value = 0;
        switch (spec->type) {
        case HVMM_ARG_NUMBER:
            if (hvmm_parse_u64(word.value, &value) != 0)
                expected = "a number: decimal or 0x hex";
            break;
        case HVMM_ARG_SIZE:
            if (hvmm_parse_size(word.value, &value) != 0)
                expected = "a size: a number with an optional K/M/G/T "
                           "suffix; a fraction only if it makes whole "
                           "bytes, e.g. 1.5M";
            break;
        case HVMM_ARG_STRING:
            *(struct hvmm_str *)spec->out = word.value;
            break;
        }
        int out_of_range = expected == NULL && spec->type != HVMM_ARG_STRING &&
                           spec->ranged &&
                           (value < spec->min || value > spec->max);
        if (expected != NULL || out_of_range) {
            if (report) {
                hvmm_printf("%s: bad value '%.*s' for %s= (expected ", prog,
                            (int)word.value.len, word.value.ptr, spec->key);
                if (expected != NULL)
                    hvmm_puts(expected);
                else
                    put_range(spec);
                hvmm_putc(')');
                print_known(specs);
            }
            return -1;
        }
        if (spec->type != HVMM_ARG_STRING)
            *(uint64_t *)spec->out = value;
    }
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Free RAM                                                                */
/* ---------------------------------------------------------------------- */

static uint64_t range_size(const struct hvmm_range *r)
{
    return r->end > r->start ? r->end - r->start : 0;
}

uint64_t hvmm_free_bytes(const struct hvmm_boot_info *info)
{
    uint64_t total = 0;
    for (uint64_t i = 0; i < info->range_count; i++)
        total += range_size(&info->ranges[i]);
    return total;
}

uint64_t hvmm_free_addr(const struct hvmm_boot_info *info, uint64_t off)
{
    for (uint64_t i = 0; i < info->range_count; i++) {
        uint64_t size = range_size(&info->ranges[i]);
        if (off < size)
            return info->ranges[i].start + off;
        off -= size;
    }
    return 0;
}

void hvmm_free_iter_init(struct hvmm_free_iter *it,
                         const struct hvmm_boot_info *info, uint64_t off,
                         uint64_t len)
{
    it->info = info;
    it->range = 0;
    it->skip = off;
    it->left = len;
}

int hvmm_free_iter_next(struct hvmm_free_iter *it, uint64_t *addr,
                        uint64_t *len)
{
    while (it->left != 0 && it->range < it->info->range_count) {
        const struct hvmm_range *r = &it->info->ranges[it->range++];
        uint64_t size = range_size(r);
        if (it->skip >= size) {
            it->skip -= size;
            continue;
        }
        uint64_t n = size - it->skip;
        if (n > it->left)
            n = it->left;
        *addr = r->start + it->skip;
        *len = n;
        it->skip = 0;
        it->left -= n;
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Memory functions                                                        */
/* ---------------------------------------------------------------------- */

/* String instructions are used so that gcc cannot turn these loops back
 * into calls to themselves. The direction flag is clear at entry. */

void *memset(void *dst, int c, size_t n)
{
    void *d = dst;
    __asm__ volatile("rep stosb" : "+D"(d), "+c"(n) : "a"(c) : "memory");
    return dst;
}

void *memcpy(void *dst, const void *src, size_t n)
{
    void *d = dst;
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(src), "+c"(n) : : "memory");
    return dst;
}

void *memmove(void *dst, const void *src, size_t n)
{
    if ((uintptr_t)dst - (uintptr_t)src >= n)
        return memcpy(dst, src, n); /* no harmful overlap: copy forwards */
    /* dst overlaps the tail of src: copy backwards. */
    void *d = (char *)dst + n - 1;
    const void *s = (const char *)src + n - 1;
    __asm__ volatile("std\n\trep movsb\n\tcld"
                     : "+D"(d), "+S"(s), "+c"(n)
                     :
                     : "memory");
    return dst;
}

int memcmp(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i])
            return x[i] < y[i] ? -1 : 1;
    return 0;
}

size_t hvmm_strlen(const char *s)
{
    size_t n = 0;
    while (s[n] != '\0') {
        hvmm_barrier(); /* keeps gcc from turning the loop into strlen() */
        n++;
    }
    return n;
}
