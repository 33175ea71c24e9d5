/*
 * start.S - payload entry point (hugevmm payload protocol v1).
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

    /* No executable stack. */
    .section .note.GNU-stack, "", @progbits
