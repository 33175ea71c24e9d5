/*
 * harness.c - runs a payload's C code as an ordinary Linux process, for
 * testing the SDK and the built-in payloads without a VMM.
 *
 * The payload sources and sdk/hvmm.c are compiled for the host and linked
 * with this file (start.S and hvmm.ld are not used: hvmm_start is called
 * directly). Each vCPU is a thread. Port I/O faults (#GP -> SIGSEGV) and is
 * emulated here: console bytes are collected per vCPU and printed a line at a
 * time, a write to port 0xf4 ends the vCPU. Other faults are reported as
 * "EXCEPTION vcpu=<i> signal=<name> rip=0x<r> addr=0x<a>" and end the run.
 *
 * Free RAM is an anonymous mapping cut into ranges separated by PROT_NONE
 * gaps, so a payload that writes outside its ranges faults.
 *
 * Boot info version 1 by default; version=N sets another (2 adds the
 * virtio-mmio device list after the ranges). mmio=N (implies version 2)
 * lists N device windows: PROT_NONE pages whose 32-bit accesses as the
 * SDK makes them (movl (%rdx),%eax and movl %eax,(%rdx)) are emulated as
 * an empty slot: reads return 0, writes are ignored. So payloads find no
 * device there; real devices are tested under the VMM.
 *
 * usage: harness VCPUS LAYOUT ARGS [CHECK...]
 *   LAYOUT  comma-separated sizes with K/M suffixes: range,gap,range,...
 *   ARGS    the payload argument string (placed right before an unmapped
 *           page, so reading past arg_len faults)
 *   CHECK   poison=OFF     store a non-zero word at free-space offset OFF
 *           badmagic       corrupt the boot info magic
 *           version=N      boot info version N (default 1)
 *           mmio=N         N empty device windows, irq 5, 6, ... (version 2)
 *           seq=BYTES:P    after the run, the first BYTES of free space
 *                          hold addr ^ pass_key(P) and the rest is zero
 *           rand=BYTES:P   every non-zero word in the first BYTES holds
 *                          addr ^ pass_key(p) for a p in 1..P, and the rest
 *                          is zero
 *
 * Prints the payload's lines, then "vcpu <i> status <s>" for each vCPU,
 * then "checked" if the CHECKs passed. Exit status: like hugevmm run (the
 * first non-zero vCPU status), 100 on an exception, 101 on a failed check.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "hvmm.h"

int hvmm_start(unsigned vcpu, const struct hvmm_boot_info *info);

#define MAX_VCPUS 64
#define MAX_RANGES 32
#define MAX_MMIO 8

static struct hvmm_boot_info *info;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static int exit_status[MAX_VCPUS];
static int exception_seen;
static uint8_t *mmio_windows; /* MAX_MMIO PROT_NONE pages */
static uint64_t mmio_window_count;

static __thread unsigned my_vcpu;
static __thread sigjmp_buf my_exit;
static __thread char line[4096];
static __thread size_t line_len;

static void flush_line(void)
{
    pthread_mutex_lock(&out_lock);
    fwrite(line, 1, line_len, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    pthread_mutex_unlock(&out_lock);
    line_len = 0;
}

static void on_signal(int sig, siginfo_t *si, void *uc_)
{
    ucontext_t *uc = uc_;
    greg_t *r = uc->uc_mcontext.gregs;
    const uint8_t *ip = (const uint8_t *)r[REG_RIP];
    if (sig == SIGSEGV && (ip[0] == 0xee || ip[0] == 0xef || ip[0] == 0xe6 ||
                           ip[0] == 0xe7)) {
        int imm = ip[0] == 0xe6 || ip[0] == 0xe7;
        unsigned port = imm ? ip[1] : (unsigned)(r[REG_RDX] & 0xffff);
        uint32_t value = (uint32_t)r[REG_RAX];
        int is_byte = ip[0] == 0xee || ip[0] == 0xe6;
        if (port == HVMM_PORT_CONSOLE && is_byte) {
            char c = (char)value;
            if (c == '\n')
                flush_line();
            else if (line_len < sizeof(line))
                line[line_len++] = c;
        } else if (port == HVMM_PORT_EXIT && !is_byte) {
            if (line_len)
                flush_line();
            exit_status[my_vcpu] = (int)value;
            siglongjmp(my_exit, 1);
        } else {
            pthread_mutex_lock(&out_lock);
            printf("PORT vcpu=%u port=0x%x\n", my_vcpu, port);
            pthread_mutex_unlock(&out_lock);
        }
        r[REG_RIP] += imm ? 2 : 1;
        return;
    }
    uint8_t *fault = si->si_addr;
    if (sig == SIGSEGV && mmio_window_count != 0 && fault >= mmio_windows &&
        fault < mmio_windows + mmio_window_count * 4096 &&
        (uintptr_t)fault == (uintptr_t)r[REG_RDX] && ip[1] == 0x02 &&
        (ip[0] == 0x8b || ip[0] == 0x89)) {
        if (ip[0] == 0x8b) /* movl (%rdx), %eax: an empty slot reads 0 */
            r[REG_RAX] = 0;
        r[REG_RIP] += 2;
        return;
    }
    if (line_len)
        flush_line();
    pthread_mutex_lock(&out_lock);
    printf("EXCEPTION vcpu=%u signal=%s rip=0x%llx addr=0x%llx\n", my_vcpu,
           sig == SIGSEGV ? "SEGV" : sig == SIGILL ? "ILL" :
           sig == SIGFPE ? "FPE" : "other",
           (unsigned long long)r[REG_RIP],
           (unsigned long long)(uintptr_t)si->si_addr);
    fflush(stdout);
    exception_seen = 1;
    pthread_mutex_unlock(&out_lock);
    exit_status[my_vcpu] = -1;
    siglongjmp(my_exit, 1);
}

static void *vcpu_thread(void *arg)
{
    my_vcpu = (unsigned)(uintptr_t)arg;
    if (sigsetjmp(my_exit, 1) == 0) {
        int status = hvmm_start(my_vcpu, info);
        hvmm_exit((uint32_t)status); /* what start.S does */
    }
    return NULL;
}

static uint64_t parse_size(const char *s, char **end)
{
    uint64_t v = strtoull(s, end, 0);
    switch (**end) {
    case 'K': v <<= 10; (*end)++; break;
    case 'M': v <<= 20; (*end)++; break;
    case 'G': v <<= 30; (*end)++; break;
    }
    return v;
}

/* Free-space offset -> address (independent of the SDK's version). */
static uint64_t *word_at(uint64_t off)
{
    for (uint64_t i = 0; i < info->range_count; i++) {
        uint64_t size = info->ranges[i].end - info->ranges[i].start;
        if (off < size)
            return (uint64_t *)(uintptr_t)(info->ranges[i].start + off);
        off -= size;
    }
    abort();
}

static int check_words(int random, uint64_t bytes, uint64_t passes)
{
    uint64_t total = hvmm_free_bytes(info), written = 0;
    for (uint64_t off = 0; off < total; off += 8) {
        uint64_t *w = word_at(off);
        uint64_t a = (uintptr_t)w;
        if (off >= (bytes & ~7ull)) {
            if (*w != 0) {
                printf("CHECK: word at 0x%llx beyond the working set is 0x%llx\n",
                       (unsigned long long)a, (unsigned long long)*w);
                return -1;
            }
            continue;
        }
        if (!random) {
            uint64_t want = passes ? a ^ (passes * 0x9e3779b97f4a7c15ull) : 0;
            if (*w != want) {
                printf("CHECK: word at 0x%llx is 0x%llx, want 0x%llx\n",
                       (unsigned long long)a, (unsigned long long)*w,
                       (unsigned long long)want);
                return -1;
            }
            continue;
        }
        if (*w == 0)
            continue;
        written++;
        uint64_t p = 1;
        while (p <= passes && *w != (a ^ (p * 0x9e3779b97f4a7c15ull)))
            p++;
        if (p > passes) {
            printf("CHECK: word at 0x%llx has unexpected 0x%llx\n",
                   (unsigned long long)a, (unsigned long long)*w);
            return -1;
        }
    }
    if (random)
        printf("written_words=%llu\n", (unsigned long long)written);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: harness VCPUS LAYOUT ARGS [CHECK...]\n");
        return 64;
    }
    unsigned vcpus = (unsigned)atoi(argv[1]);
    if (vcpus == 0 || vcpus > MAX_VCPUS)
        return 64;

    /* Layout: range,gap,range,... */
    uint64_t sizes[2 * MAX_RANGES], n = 0, span = 4096; /* leading guard */
    for (char *p = argv[2]; *p && n < 2 * MAX_RANGES;) {
        sizes[n] = parse_size(p, &p);
        span += sizes[n++];
        if (*p == ',')
            p++;
    }
    span += 4096; /* trailing guard */
    uint8_t *base = mmap(NULL, span, PROT_NONE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED)
        return 65;

    info = calloc(1, sizeof(*info) + MAX_RANGES * sizeof(struct hvmm_range) +
                         8 + MAX_MMIO * sizeof(struct hvmm_mmio));
    info->magic = HVMM_BOOT_MAGIC;
    info->version = 1;
    info->vcpu_count = vcpus;
    info->ram_bytes = span;
    uint64_t at = 4096;
    for (uint64_t i = 0; i < n; i++) {
        if (i % 2 == 0 && sizes[i] != 0) {
            mprotect(base + at, sizes[i], PROT_READ | PROT_WRITE);
            info->ranges[info->range_count].start = (uintptr_t)(base + at);
            info->ranges[info->range_count].end = (uintptr_t)(base + at + sizes[i]);
            info->range_count++;
        }
        at += sizes[i];
    }

    /* Arguments end right before an unmapped page. */
    size_t arg_len = strlen(argv[3]);
    uint8_t *args = mmap(NULL, 2 * 4096 + arg_len, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    size_t arg_pages = (arg_len + 4095) / 4096 * 4096;
    mprotect(args + arg_pages, 4096, PROT_NONE);
    memcpy(args + arg_pages - arg_len, argv[3], arg_len);
    info->arg_ptr = (uintptr_t)(args + arg_pages - arg_len);
    info->arg_len = arg_len;

    int seq = 0, rand_check = 0;
    uint64_t check_bytes = 0, check_passes = 0;
    for (int i = 4; i < argc; i++) {
        char *end;
        if (strncmp(argv[i], "poison=", 7) == 0) {
            *word_at(parse_size(argv[i] + 7, &end)) = 0x5a5a;
        } else if (strcmp(argv[i], "badmagic") == 0) {
            info->magic ^= 1;
        } else if (strncmp(argv[i], "version=", 8) == 0) {
            info->version = (uint32_t)strtoul(argv[i] + 8, &end, 0);
        } else if (strncmp(argv[i], "mmio=", 5) == 0) {
            mmio_window_count = strtoull(argv[i] + 5, &end, 0);
            if (mmio_window_count > MAX_MMIO)
                return 64;
            info->version = 2;
        } else if (strncmp(argv[i], "seq=", 4) == 0 ||
                   strncmp(argv[i], "rand=", 5) == 0) {
            seq = argv[i][0] == 's';
            rand_check = !seq;
            check_bytes = parse_size(strchr(argv[i], '=') + 1, &end);
            check_passes = strtoull(end + 1, &end, 0);
        } else {
            fprintf(stderr, "unknown check %s\n", argv[i]);
            return 64;
        }
    }

    /* Version 2: u64 mmio_count after the ranges, then the entries. */
    mmio_windows = mmap(NULL, MAX_MMIO * 4096, PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint64_t *mmio_list = (uint64_t *)&info->ranges[info->range_count];
    mmio_list[0] = mmio_window_count;
    struct hvmm_mmio *mmio = (struct hvmm_mmio *)(mmio_list + 1);
    for (uint64_t i = 0; i < mmio_window_count; i++) {
        mmio[i].base = (uintptr_t)(mmio_windows + i * 4096);
        mmio[i].size_bytes = 4096;
        mmio[i].irq = (uint32_t)(5 + i);
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGILL, &sa, NULL);
    sigaction(SIGFPE, &sa, NULL);

    pthread_t threads[MAX_VCPUS];
    for (unsigned i = 0; i < vcpus; i++)
        pthread_create(&threads[i], NULL, vcpu_thread, (void *)(uintptr_t)i);
    for (unsigned i = 0; i < vcpus; i++)
        pthread_join(threads[i], NULL);

    int status = 0;
    for (unsigned i = 0; i < vcpus; i++) {
        printf("vcpu %u status %d\n", i, exit_status[i]);
        if (status == 0)
            status = exit_status[i];
    }
    if (exception_seen)
        return 100;
    if ((seq || rand_check) && check_words(rand_check, check_bytes, check_passes) != 0)
        return 101;
    if (seq || rand_check)
        printf("checked\n");
    return status;
}
