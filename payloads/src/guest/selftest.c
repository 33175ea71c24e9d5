/*
 * selftest - small behaviours for the VMM's own tests.
 *
 * Arguments (all optional, applied in this order):
 *   args=1       print the raw argument string and the boot info
 *   print=TEXT   print TEXT as a line (TEXT cannot contain spaces)
 *   fault=KIND   raise an exception: ud (ud2), pf (write to 0xc0000000, in
 *                the device hole), gp (mov %cr0 at CPL 3), de (divide by 0)
 *   vcpu=K       only vCPU K raises the fault (default: every vCPU); K is
 *                0 to vcpu_count - 1 (another index is refused, status 2)
 *   exit=N       exit status, 0 to 2^32 - 1 (default 0), also for vCPUs
 *                that do not fault
 *
 * Output lines (every vCPU):
 *   args=1:
 *     selftest vcpu=<i> info=0x<a> rsp=0x<a> magic=0x<m> version=<v>
 *       vcpu_count=<n> ram_bytes=<b> arg_len=<l> range_count=<r>
 *       free_bytes=<f> mmio_count=<m>                (one line)
 *     selftest vcpu=<i> range=<j> start=0x<s> end=0x<e>   (per range)
 *     selftest vcpu=<i> mmio=<j> base=0x<b> size=0x<s> irq=<q>
 *       (per virtio-mmio device; mmio_count is 0 for version 1)
 *     selftest vcpu=<i> args=<the argument string, verbatim>
 *   print=TEXT:
 *     TEXT
 *   fault=KIND, just before the faulting instruction:
 *     selftest vcpu=<i> fault=<kind> rip=0x<address of the instruction>
 *   (pf adds addr=0xc0000000, the expected cr2). If the instruction does
 *   not fault, "selftest: fault=<kind> did not fault" and status 3.
 */
#include "common.h"

/*
 * The faulting instructions, each behind a label so the expected rip can
 * be printed. Each routine returns if its instruction did not fault.
 * They only clobber rax, rcx and rdx (caller-saved).
 */
void fault_ud(void);
void fault_pf(void);
void fault_gp(void);
void fault_de(void);
extern const char fault_ud_rip[], fault_pf_rip[], fault_gp_rip[],
    fault_de_rip[];
__asm__(".text\n"
        "fault_ud:\n"
        "fault_ud_rip:\n"
        "    ud2\n"
        "    ret\n"
        "fault_pf:\n"
        "    movl $0xc0000000, %eax\n"
        "fault_pf_rip:\n"
        "    movq $1, (%rax)\n"
        "    ret\n"
        "fault_gp:\n"
        "fault_gp_rip:\n"
        "    movq %cr0, %rax\n"
        "    ret\n"
        "fault_de:\n"
        "    movl $1, %eax\n"
        "    xorl %edx, %edx\n"
        "    xorl %ecx, %ecx\n"
        "fault_de_rip:\n"
        "    divl %ecx\n"
        "    ret\n");

struct fault_kind {
    const char *name;
    void (*raise)(void);
    const char *rip;
};

static const struct fault_kind faults[] = {
    { "ud", fault_ud, fault_ud_rip },
    { "pf", fault_pf, fault_pf_rip },
    { "gp", fault_gp, fault_gp_rip },
    { "de", fault_de, fault_de_rip },
};
#define NFAULTS (sizeof(faults) / sizeof(faults[0]))

static void print_boot_info(unsigned vcpu, const struct hvmm_boot_info *info)
{
    uint64_t rsp, mmio_count;
    const struct hvmm_mmio *mmio = hvmm_mmio_devices(info, &mmio_count);
    __asm__ volatile("movq %%rsp, %0" : "=r"(rsp));
    hvmm_printf("selftest vcpu=%u info=%p rsp=0x%lx magic=0x%lx version=%u "
                "vcpu_count=%u ram_bytes=%lu arg_len=%lu range_count=%lu "
                "free_bytes=%lu mmio_count=%lu\n",
                vcpu, (const void *)info, rsp, info->magic, info->version,
                info->vcpu_count, info->ram_bytes, info->arg_len,
                info->range_count, hvmm_free_bytes(info), mmio_count);
    for (uint64_t j = 0; j < info->range_count; j++)
        hvmm_printf("selftest vcpu=%u range=%lu start=0x%lx end=0x%lx\n", vcpu,
                    j, info->ranges[j].start, info->ranges[j].end);
    for (uint64_t j = 0; j < mmio_count; j++)
        hvmm_printf("selftest vcpu=%u mmio=%lu base=0x%lx size=0x%lx irq=%u\n",
                    vcpu, j, mmio[j].base, mmio[j].size_bytes, mmio[j].irq);
    hvmm_printf("selftest vcpu=%u args=", vcpu);
    hvmm_write((const char *)(uintptr_t)info->arg_ptr, info->arg_len);
    hvmm_putc('\n');
}

int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info)
{
    uint64_t exit_status = 0, only_vcpu = UINT64_MAX, show_args = 0;
    struct hvmm_str fault = { NULL, 0 }, text = { NULL, 0 };
    /* vcpu= names one of this VM's vCPUs: another index would fault on
     * none, and a fault test would pass without its fault. */
    const struct hvmm_arg_spec specs[] = {
        { "exit", HVMM_ARG_NUMBER, &exit_status, HVMM_ARG_RANGE(0, UINT32_MAX) },
        { "fault", HVMM_ARG_STRING, &fault, HVMM_ARG_ANY },
        { "vcpu", HVMM_ARG_NUMBER, &only_vcpu,
          HVMM_ARG_RANGE(0, vcpu_count(info) - 1) },
        { "print", HVMM_ARG_STRING, &text, HVMM_ARG_ANY },
        { "args", HVMM_ARG_NUMBER, &show_args, HVMM_ARG_RANGE(0, 1) },
        HVMM_ARG_END,
    };
    int report = vcpu == 0;
    if (hvmm_parse_args(info, "selftest", specs, report) != 0)
        return 2;

    /* Values parse_args cannot check by itself. */
    const struct fault_kind *kind = NULL;
    if (fault.ptr != NULL) {
        for (unsigned i = 0; i < NFAULTS; i++)
            if (hvmm_str_eq(fault, faults[i].name))
                kind = &faults[i];
        if (kind == NULL) {
            if (report)
                hvmm_printf("selftest: bad value '%.*s' for fault= (expected "
                            "ud, pf, gp or de); known: exit= fault= vcpu= "
                            "print= args=\n",
                            (int)fault.len, fault.ptr);
            return 2;
        }
    }

    if (show_args)
        print_boot_info(vcpu, info);
    if (text.ptr != NULL) {
        hvmm_write(text.ptr, text.len);
        hvmm_putc('\n');
    }
    if (kind != NULL && (only_vcpu == UINT64_MAX || only_vcpu == vcpu)) {
        hvmm_printf("selftest vcpu=%u fault=%s rip=%p%s\n", vcpu, kind->name,
                    (const void *)kind->rip,
                    kind->raise == fault_pf ? " addr=0xc0000000" : "");
        kind->raise();
        hvmm_printf("selftest: fault=%s did not fault\n", kind->name);
        return 3;
    }
    return (int)exit_status;
}
