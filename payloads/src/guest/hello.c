/*
 * hello - every vCPU prints one line and exits with status 0.
 *
 * Output: hello from vcpu <i> of <n>
 */
#include "hvmm.h"

int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info)
{
    static const struct hvmm_arg_spec specs[] = { HVMM_ARG_END };
    if (hvmm_parse_args(info, "hello", specs, vcpu == 0) != 0)
        return 2;
    hvmm_printf("hello from vcpu %u of %u\n", vcpu, info->vcpu_count);
    return 0;
}
