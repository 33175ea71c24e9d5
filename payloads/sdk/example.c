/*
 * The smallest useful payload, built by README.md's "Running payloads"
 * example: each vCPU greets, vCPU 0 fills and checks `bytes=` of free RAM
 * with a pattern, and the run ends with status 0 (1 on a wrong word, 2 on
 * a bad argument). Copy it to start your own.
 */
#include "hvmm.h"

int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info)
{
    uint64_t bytes = 16 << 20;
    struct hvmm_str greeting = {"hello", 5};
    const struct hvmm_arg_spec specs[] = {
        {"bytes", HVMM_ARG_SIZE, &bytes},
        {"greeting", HVMM_ARG_STRING, &greeting},
        {0, 0, 0},
    };
    if (hvmm_parse_args(info, "example", specs, vcpu == 0) != 0)
        return 2;
    hvmm_printf("example vcpu=%u: %.*s\n", vcpu, (int)greeting.len, greeting.ptr);
    if (vcpu != 0)
        return 0;
    if (bytes > hvmm_free_bytes(info)) {
        hvmm_printf("example: bytes=%lu is more than the %lu bytes of free RAM\n",
                    bytes, hvmm_free_bytes(info));
        return 2;
    }
    struct hvmm_free_iter it;
    uint64_t addr, len;
    hvmm_free_iter_init(&it, info, 0, bytes);
    while (hvmm_free_iter_next(&it, &addr, &len))
        for (uint64_t *w = (uint64_t *)addr; w < (uint64_t *)(addr + len); w++)
            *w = (uint64_t)w ^ 0x5a5a5a5a5a5a5a5aull;
    hvmm_free_iter_init(&it, info, 0, bytes);
    while (hvmm_free_iter_next(&it, &addr, &len))
        for (uint64_t *w = (uint64_t *)addr; w < (uint64_t *)(addr + len); w++)
            if (*w != ((uint64_t)w ^ 0x5a5a5a5a5a5a5a5aull)) {
                hvmm_printf("example: wrong word at %p\n", (void *)w);
                return 1;
            }
    hvmm_printf("example: %lu bytes written and checked\n", bytes);
    return 0;
}
