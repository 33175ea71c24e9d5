/*
 * start.S - payload entry point and protocol note (hugevmm payload
 * protocol, versions 1 and 2).
 *
 * At entry every vCPU is in 64-bit mode at CPL 3 with
 *   %rdi = vCPU index, %rsi = boot info address,
 *   %rsp = 16-byte-aligned top of this vCPU's own stack.
 * _start calls hvmm_start(vcpu, info) (hvmm.c), which checks the boot info
 * and calls the payload's hvmm_main(). Its return value is this vCPU's exit
 * status: written with a 32-bit outl to port 0xf4, which makes the VMM stop
 * the vCPU. _start never returns.
 */
    .section .text.start, "ax", @progbits
    .globl  _start
    .type   _start, @function
_start:
    xorl    %ebp, %ebp          /* terminate frame-pointer chains */
    call    hvmm_start          /* rsp is 16-byte aligned before the call */
    movw    $0xf4, %dx
1:  outl    %eax, %dx           /* exit status; the VMM stops us here */
    jmp     1b
    .size   _start, . - _start

    /*
     * The opt-in note of protocol version 2 (docs/PAYLOAD_PROTOCOL.md):
     * an ELF note with name "HVMM", type 1 and a 4-byte descriptor holding
     * the highest protocol version this SDK understands (2, which is
     * HVMM_BOOT_VERSION in hvmm.h). hvmm.ld keeps it in the section
     * .note.hvmm (SHT_NOTE) inside a PT_NOTE segment. Layout, 24 bytes:
     *   u32 namesz = 5, u32 descsz = 4, u32 type = 1,
     *   "HVMM\0" padded to 8 bytes, u32 desc = 2.
     */
    .section .note.hvmm, "a", @note
    .balign 4
    .long   5                   /* namesz: "HVMM" and its NUL */
    .long   4                   /* descsz */
    .long   1                   /* type */
    .asciz  "HVMM"
    .balign 4                   /* name padded to a multiple of 4 */
    .long   2                   /* desc: highest protocol version spoken */
    .balign 4

    /* No executable stack. */
    .section .note.GNU-stack, "", @progbits
