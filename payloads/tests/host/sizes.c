/*
 * sizes.c - a host-test payload that reads its arguments s0=, s1=, ...
 * (up to s63=) with hvmm_arg_size and prints, on vCPU 0, one line each:
 *   size s<i> <bytes>     or     size s<i> bad
 * so that tests can hold the SDK's size syntax against hugevmm's own.
 */
#include "hvmm.h"

int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info)
{
    if (vcpu != 0)
        return 0;
    for (unsigned i = 0; i < 64; i++) {
        char key[4] = { 's', 0, 0, 0 };
        if (i < 10) {
            key[1] = (char)('0' + i);
        } else {
            key[1] = (char)('0' + i / 10);
            key[2] = (char)('0' + i % 10);
        }
        uint64_t bytes = 0;
        int r = hvmm_arg_size(info, key, &bytes);
        if (r == HVMM_ARG_FOUND)
            hvmm_printf("size %s %lu\n", key, bytes);
        else if (r == HVMM_ARG_BAD)
            hvmm_printf("size %s bad\n", key);
    }
    return 0;
}
