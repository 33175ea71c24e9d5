//! One vCPU thread: runs the vCPU and turns every KVM exit into an action.

use crate::console::{ConsoleSink, VcpuConsole};
use crate::cpu;
use crate::event::RunEvent;
use crate::payload::layout::EXCEPTION_PORT;
use crate::payload::port_trap;
use crate::ratelimit::GuestLog;
use devices::{MmioBus, PioBus};
use guestmem::GuestRam;
use kvm_bindings::{
    KVM_INTERNAL_ERROR_DELIVERY_EV, KVM_INTERNAL_ERROR_EMULATION, KVM_INTERNAL_ERROR_SIMUL_EX,
};
use kvm_ioctls::{VcpuExit, VcpuFd};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use vm_memory::GuestAddress;

/// Console port (byte writes).
pub const CONSOLE_PORT: u16 = 0x3f8;
/// Finish port (32-bit write of the status).
pub const FINISH_PORT: u16 = 0xf4;

/// Reports guest accesses to unknown ports and MMIO addresses, rate
/// limited per kind (`ratelimit`): the guest chooses how many there are,
/// and a set of seen addresses would grow with them.
pub struct UnknownAccessLog {
    limiter: &'static GuestLog,
}

impl Default for UnknownAccessLog {
    fn default() -> Self {
        UnknownAccessLog {
            limiter: crate::ratelimit::global(),
        }
    }
}

impl UnknownAccessLog {
    fn note(&self, index: u32, mmio: bool, addr: u64, write: bool, len: usize) {
        let what = if mmio { "MMIO address" } else { "I/O port" };
        let kind = if mmio {
            "unknown MMIO address"
        } else {
            "unknown I/O port"
        };
        if self.limiter.allow(kind) {
            let dir = if write { "write" } else { "read" };
            eprintln!(
                "hugevmm: vCPU {index}: {dir} of {len} bytes at unknown {what} {addr:#x}: writes are ignored, reads return all ones"
            );
        }
    }
}

/// What runs in the guest, which decides how exits are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestKind {
    /// A payload (docs/PAYLOAD_PROTOCOL.md): console, finish and exception
    /// ports are the VMM's.
    Payload,
    /// A Linux kernel: ports go to the device models.
    Linux,
}

/// Everything a vCPU thread needs.
pub struct VcpuContext {
    /// What runs in the guest.
    pub kind: GuestKind,
    /// Port I/O devices.
    pub pio: Arc<PioBus>,
    /// MMIO devices.
    pub mmio: Arc<MmioBus>,
    /// vCPU index.
    pub index: u32,
    /// Guest RAM, to read the exception frame.
    pub ram: Arc<GuestRam>,
    /// Console sink.
    pub console: ConsoleSink,
    /// Unknown-access log shared by all vCPUs.
    pub unknown: Arc<UnknownAccessLog>,
    /// Where to report.
    pub events: Sender<RunEvent>,
    /// Set when the run ends: the thread leaves at its next exit.
    pub stop: crate::vcpu_stop::StopFlag,
}

enum Step {
    Continue,
    Finish(u32),
    Reset(&'static str),
    ExceptionReport,
    InternalError,
    Fatal(String),
}

/// Runs the vCPU until the payload finishes or something fatal happens,
/// and reports the outcome.
pub fn run(mut vcpu: VcpuFd, ctx: VcpuContext) {
    crate::seccomp::install_or_exit(crate::seccomp::ThreadKind::Vcpu);
    let mut console = VcpuConsole::new(ctx.console.clone());
    let index = ctx.index;
    let event = loop {
        if ctx.stop.is_set() {
            // The run is over and said so: nothing to report.
            console.flush();
            return;
        }
        let step = match vcpu.run() {
            Ok(exit) => dispatch(exit, &ctx, &mut console),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Step::Continue,
            Err(e) => Step::Fatal(format!("KVM_RUN failed: {e}")),
        };
        match step {
            Step::Continue => continue,
            Step::Finish(status) => break RunEvent::Finished { index, status },
            Step::Reset(how) => break RunEvent::GuestReset { how },
            Step::ExceptionReport => match handle_exception(&vcpu, &ctx, &mut console) {
                Step::Continue => continue,
                Step::Finish(status) => break RunEvent::Finished { index, status },
                Step::Fatal(message) => break RunEvent::Fatal { index, message },
                _ => unreachable!("handle_exception returns Continue, Finish or Fatal"),
            },
            Step::InternalError | Step::Fatal(_) => {
                let reason = match step {
                    Step::Fatal(reason) => reason,
                    _ => describe_internal_error(&mut vcpu),
                };
                let message = match describe_registers(&vcpu) {
                    Some(regs) => format!("{reason}\n{regs}"),
                    None => reason,
                };
                break RunEvent::Fatal { index, message };
            }
        }
    };
    console.flush();
    // The receiver is gone only when the VM already ended; nothing to do.
    let _ = ctx.events.send(event);
}

/// A port write by the guest, from an I/O exit or a trapped instruction.
fn port_write(port: u16, data: &[u8], ctx: &VcpuContext, console: &mut VcpuConsole) -> Step {
    if ctx.kind == GuestKind::Payload {
        match port {
            CONSOLE_PORT => {
                data.iter().for_each(|b| console.put(*b));
                return Step::Continue;
            }
            FINISH_PORT => {
                let mut bytes = [0u8; 4];
                let n = data.len().min(4);
                bytes[..n].copy_from_slice(&data[..n]);
                return Step::Finish(u32::from_le_bytes(bytes));
            }
            EXCEPTION_PORT => return Step::ExceptionReport,
            _ => {}
        }
    }
    if !ctx.pio.write(u64::from(port), data) {
        ctx.unknown
            .note(ctx.index, false, u64::from(port), true, data.len());
    }
    Step::Continue
}

/// A port read by the guest.
fn port_read(port: u16, data: &mut [u8], ctx: &VcpuContext) {
    if !ctx.pio.read(u64::from(port), data) {
        ctx.unknown
            .note(ctx.index, false, u64::from(port), false, data.len());
        data.fill(0xff);
    }
}

fn dispatch(exit: VcpuExit<'_>, ctx: &VcpuContext, console: &mut VcpuConsole) -> Step {
    let linux = ctx.kind == GuestKind::Linux;
    match exit {
        VcpuExit::IoOut(port, data) => port_write(port, data, ctx, console),
        VcpuExit::IoIn(port, data) => {
            port_read(port, data, ctx);
            Step::Continue
        }
        VcpuExit::MmioRead(addr, data) => {
            if !ctx.mmio.read(addr, data) {
                ctx.unknown.note(ctx.index, true, addr, false, data.len());
                data.fill(0xff);
            }
            Step::Continue
        }
        VcpuExit::MmioWrite(addr, data) => {
            if !ctx.mmio.write(addr, data) {
                ctx.unknown.note(ctx.index, true, addr, true, data.len());
            }
            Step::Continue
        }
        VcpuExit::Hlt => Step::Fatal(
            "the guest executed HLT with interrupts disabled: nothing can wake this vCPU (payloads finish by writing their status to port 0xf4)".into(),
        ),
        // Linux reboots by triple fault when the i8042 reset does not work.
        VcpuExit::Shutdown if linux => Step::Reset("triple fault (reboot)"),
        VcpuExit::Shutdown => Step::Fatal(
            "triple fault (KVM_EXIT_SHUTDOWN): the guest hit an exception it could not deliver".into(),
        ),
        VcpuExit::FailEntry(reason, cpu) => Step::Fatal(format!(
            "KVM could not enter the guest (KVM_EXIT_FAIL_ENTRY): hardware entry failure reason {reason:#x} on host CPU {cpu}"
        )),
        // Its detail lives in kvm_run, which this exit borrow hides.
        VcpuExit::InternalError => Step::InternalError,
        VcpuExit::SystemEvent(..) if linux => Step::Reset("system event (power off or reset)"),
        VcpuExit::SystemEvent(kind, data) => Step::Fatal(format!(
            "the guest requested a system event (type {kind}, data {data:x?}); payloads finish through port 0xf4"
        )),
        other => Step::Fatal(format!("unexpected KVM exit: {other:?}")),
    }
}

/// Reads the internal-error detail from `kvm_run`.
fn describe_internal_error(vcpu: &mut VcpuFd) -> String {
    let rip = vcpu.get_regs().map(|r| r.rip).unwrap_or_default();
    let run = vcpu.get_kvm_run();
    // SAFETY: exit_reason is KVM_EXIT_INTERNAL_ERROR (the caller saw
    // VcpuExit::InternalError), so `internal` is the active union member.
    let internal = unsafe { run.__bindgen_anon_1.internal };
    let ndata = (internal.ndata as usize).min(internal.data.len());
    let data = &internal.data[..ndata];
    match internal.suberror {
        KVM_INTERNAL_ERROR_EMULATION => {
            // With KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES,
            // data[1] holds the byte count and data[2..] the bytes.
            let bytes = match data {
                [flags, count, words @ ..] if flags & 1 != 0 => {
                    let all: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                    let n = (*count as usize).min(all.len());
                    format!(
                        ", instruction bytes {}",
                        all[..n]
                            .iter()
                            .map(|b| format!("{b:02x}"))
                            .collect::<Vec<_>>()
                            .join(" ")
                    )
                }
                _ => String::new(),
            };
            format!(
                "KVM emulation failure at rip {rip:#x}{bytes}: this host's KVM emulates guest code that runs at CPL 0 and its emulator lacks this instruction. Payloads run their code at CPL 3; a full Linux boot needs a host with VMX/SVM"
            )
        }
        KVM_INTERNAL_ERROR_SIMUL_EX => {
            format!("KVM internal error at rip {rip:#x}: exception while delivering an exception (suberror 2, data {data:x?})")
        }
        KVM_INTERNAL_ERROR_DELIVERY_EV => {
            format!("KVM internal error at rip {rip:#x}: event delivery failed (suberror 3, data {data:x?})")
        }
        other => format!("KVM internal error at rip {rip:#x}: suberror {other}, data {data:x?}"),
    }
}

fn describe_registers(vcpu: &VcpuFd) -> Option<String> {
    let r = vcpu.get_regs().ok()?;
    let s = vcpu.get_sregs().ok()?;
    Some(format!(
        "  rip={:#018x} rsp={:#018x} rflags={:#x} cpl={}\n  rax={:#x} rbx={:#x} rcx={:#x} rdx={:#x} rsi={:#x} rdi={:#x} rbp={:#x}\n  r8={:#x} r9={:#x} r10={:#x} r11={:#x} r12={:#x} r13={:#x} r14={:#x} r15={:#x}\n  cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} efer={:#x} cs={:#x} ss={:#x}",
        r.rip, r.rsp, r.rflags, s.cs.selector & 3, r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp,
        r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, s.cr0, s.cr2, s.cr3, s.cr4, s.efer,
        s.cs.selector, s.ss.selector
    ))
}

/// Names of the architectural exception vectors.
fn vector_name(vector: u64) -> &'static str {
    match vector {
        0 => "#DE divide error",
        1 => "#DB debug",
        2 => "NMI",
        3 => "#BP breakpoint",
        4 => "#OF overflow",
        5 => "#BR bound range",
        6 => "#UD invalid opcode",
        7 => "#NM device not available",
        8 => "#DF double fault",
        10 => "#TS invalid TSS",
        11 => "#NP segment not present",
        12 => "#SS stack fault",
        13 => "#GP general protection",
        14 => "#PF page fault",
        16 => "#MF x87 floating point",
        17 => "#AC alignment check",
        18 => "#MC machine check",
        19 => "#XM SIMD floating point",
        20 => "#VE virtualization",
        21 => "#CP control protection",
        _ => "interrupt",
    }
}

/// The frame the exception stub leaves on the supervisor stack: the CPU's
/// frame with the vector and a (real or zero) error code pushed on top.
struct ExceptionFrame {
    vector: u64,
    error_code: u64,
    rip: u64,
    cs: u64,
    rflags: u64,
    rsp: u64,
}

fn read_frame(ram: &GuestRam, rsp: u64) -> Option<ExceptionFrame> {
    let mut raw = [0u8; 56];
    ram.read_bytes(GuestAddress(rsp), &mut raw).ok()?;
    let word = |i: usize| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap());
    Some(ExceptionFrame {
        vector: word(0),
        error_code: word(1),
        rip: word(2),
        cs: word(3),
        rflags: word(4),
        rsp: word(5),
    })
}

/// Handles a report from the exception stubs: emulates port I/O that the
/// host refused at CPL 3 (see `port_trap`), or describes a real exception.
fn handle_exception(vcpu: &VcpuFd, ctx: &VcpuContext, console: &mut VcpuConsole) -> Step {
    let (Ok(mut regs), Ok(mut sregs)) = (vcpu.get_regs(), vcpu.get_sregs()) else {
        return Step::Fatal("guest exception (registers unreadable)".into());
    };
    if sregs.cs.selector & 3 != 0 {
        return Step::Fatal(format!(
            "the payload wrote to port {EXCEPTION_PORT:#x}, which is reserved for the VMM's exception stubs (rip {:#x})",
            regs.rip
        ));
    }
    let Some(frame) = read_frame(&ctx.ram, regs.rsp) else {
        return Step::Fatal(format!(
            "guest exception with an unreadable frame at rsp {:#x}",
            regs.rsp
        ));
    };
    const GENERAL_PROTECTION: u64 = 13;
    let mut insn = [0u8; 3];
    let from_user = frame.cs & 3 == 3;
    if frame.vector == GENERAL_PROTECTION
        && from_user
        && ctx
            .ram
            .read_bytes(GuestAddress(frame.rip), &mut insn)
            .is_ok()
    {
        if let Some(io) = port_trap::decode(&insn, regs.rdx) {
            let step = if io.write {
                let data = regs.rax.to_le_bytes();
                port_write(io.port, &data[..io.size], ctx, console)
            } else {
                let mut data = [0u8; 4];
                port_read(io.port, &mut data[..io.size], ctx);
                regs.rax = port_trap::merge_in_value(regs.rax, io.size, &data);
                Step::Continue
            };
            if !matches!(step, Step::Continue) {
                return step;
            }
            // Return to the payload after the instruction, as iretq would.
            regs.rip = frame.rip + io.len;
            regs.rsp = frame.rsp;
            regs.rflags = frame.rflags;
            sregs.cs = cpu::user_code_segment();
            sregs.ss = cpu::user_data_segment();
            return match vcpu.set_sregs(&sregs).and_then(|_| vcpu.set_regs(&regs)) {
                Ok(()) => Step::Continue,
                Err(e) => Step::Fatal(format!(
                    "cannot resume the guest after emulating port I/O: {e}"
                )),
            };
        }
    }
    Step::Fatal(format!(
        "guest exception: vector {} ({}), error code {:#x}, rip {:#x}, cr2 {:#x} (cs {:#x}, rsp {:#x}, rflags {:#x})",
        frame.vector,
        vector_name(frame.vector),
        frame.error_code,
        frame.rip,
        sregs.cr2,
        frame.cs,
        frame.rsp,
        frame.rflags
    ))
}
