//! `hugevmm run`'s options: the flags, the `--config FILE` that describes
//! the same VM, and the two merged (flags over the file).
//!
//! One struct, [`RunFlags`], is both the flags (clap) and the file (serde,
//! keys named as the flags without their dashes), so that every flag can
//! be written in the file by construction; the file rejects unknown keys
//! by name. [`resolve`] merges them and fills the defaults into
//! [`RunArgs`], and keeps the merged options, as given, for `GET /vm`:
//! saved to a file they run the same VM again.

use crate::linux::VirtioAnnounce;
use anyhow::{bail, Context, Result};
use devices::virtio::DiskSpec;
use guestmem::{parse_size, Backing};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use swap::engine::SwapUnit;
use swap::store::StoreSpec;

/// Default `--mem`.
const DEFAULT_MEM_BYTES: u64 = 512 << 20;

/// Largest `--config` file read: a VM's description is a few hundred bytes.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

pub(crate) fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// `--mem-limit`: a cap on resident guest RAM, or `none`: the swap engine
/// without a cap (every first touch served as a whole unit; a cap can be
/// set at run time), the same word `hugevmm ctl ... mem-limit` takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemLimit {
    /// At most this many bytes resident.
    Bytes(u64),
    /// `none`: no cap.
    Unlimited,
    /// `auto[=stall:PCT]`: a cap the engine sizes from the guest's stall
    /// (`swap::engine::sizing`), aiming at `stall_pct` % of the time.
    Auto {
        /// The stall aimed for, percent of wall time.
        stall_pct: f64,
    },
}

impl MemLimit {
    /// The fixed cap, if any.
    pub fn bytes(self) -> Option<u64> {
        match self {
            MemLimit::Bytes(bytes) => Some(bytes),
            MemLimit::Unlimited | MemLimit::Auto { .. } => None,
        }
    }
}

/// The word for [`MemLimit::Unlimited`].
const NO_LIMIT: &str = "none";

/// The word for [`MemLimit::Auto`].
const AUTO_LIMIT: &str = "auto";

/// `--mem-limit auto`'s stall target when none is given, percent: small
/// enough that the guest barely notices, large enough that the
/// controller's probing finds the working set (docs/ARCHITECTURE.md,
/// "Memory that sizes itself").
pub const DEFAULT_STALL_PCT: f64 = 2.0;

/// The stall targets `--mem-limit auto=stall:PCT` accepts, percent.
const STALL_PCT_RANGE: std::ops::RangeInclusive<f64> = 0.1..=50.0;

fn parse_mem_limit(s: &str) -> Result<MemLimit, String> {
    let s = s.trim();
    if s == NO_LIMIT {
        return Ok(MemLimit::Unlimited);
    }
    if s == AUTO_LIMIT {
        return Ok(MemLimit::Auto {
            stall_pct: DEFAULT_STALL_PCT,
        });
    }
    if let Some(rest) = s.strip_prefix("auto=") {
        let expected = format!(
            "`auto=stall:PCT` takes the stall to aim for, {} to {} percent of the time (e.g. auto=stall:{DEFAULT_STALL_PCT})",
            STALL_PCT_RANGE.start(),
            STALL_PCT_RANGE.end()
        );
        let pct = rest
            .strip_prefix("stall:")
            .ok_or_else(|| format!("{s:?}: {expected}"))?
            .trim_end_matches('%');
        return match pct.parse::<f64>() {
            Ok(stall_pct) if STALL_PCT_RANGE.contains(&stall_pct) => {
                Ok(MemLimit::Auto { stall_pct })
            }
            _ => Err(format!("{s:?}: {expected}")),
        };
    }
    parse_size(s).map(MemLimit::Bytes).map_err(|e| {
        format!("{e} (or `{NO_LIMIT}`: the swap engine without a cap; or `{AUTO_LIMIT}[=stall:PCT]`: a cap sized from the guest's stall)")
    })
}

/// What `--metrics-addr` takes, for its errors.
const METRICS_ADDR_EXPECTED: &str =
    "give ADDR:PORT, e.g. 127.0.0.1:9800, [::1]:9800 or localhost:9800";

/// `--metrics-addr`: an IP address and port, or a host name and port,
/// resolved now (its first IPv4 address, else its first address), so that
/// `GET /vm` shows the address served.
pub fn parse_metrics_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!("'{s}' has no port: {METRICS_ADDR_EXPECTED}"));
    };
    let Ok(port) = port.parse::<u16>() else {
        return Err(format!(
            "'{port}' in '{s}' is not a port (0 to 65535): {METRICS_ADDR_EXPECTED}"
        ));
    };
    if host.is_empty() || host.starts_with('[') {
        return Err(format!("'{s}' is not an address: {METRICS_ADDR_EXPECTED}"));
    }
    let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .map_err(|e| format!("cannot resolve '{host}' ({e}): {METRICS_ADDR_EXPECTED}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("'{host}' has no address: {METRICS_ADDR_EXPECTED}"))
}

/// The flags of `hugevmm run`, and the keys of its `--config` file.
#[derive(clap::Args, Debug, Default, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct RunFlags {
    /// Read the VM's description from this JSON file (keys are the flags'
    /// names without `--`, e.g. {"mem": "1G", "vcpus": 2, "payload":
    /// "verify"}); flags given too override it.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Guest RAM size, a multiple of 2 MiB (e.g. 512M, 4G) [default: 512M].
    #[arg(long, value_parser = parse_size_arg)]
    #[serde(with = "size", skip_serializing_if = "Option::is_none")]
    pub mem: Option<u64>,
    /// Number of vCPUs (one host thread each) [default: 1].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    /// Host backing of guest RAM: thp (2 MiB transparent huge pages),
    /// hugetlb (2 MiB hugetlbfs pages, needs /proc/sys/vm/nr_hugepages) or
    /// 4k (small pages, the baseline) [default: thp].
    #[arg(long)]
    #[serde(with = "text", skip_serializing_if = "Option::is_none")]
    pub backing: Option<Backing>,
    /// Built-in payload to run (see `hugevmm payloads`).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// Payload ELF file to run.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_file: Option<PathBuf>,
    /// Linux kernel to boot: a bzImage (decompressed on the host) or an ELF
    /// vmlinux.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<PathBuf>,
    /// Initial ramdisk for --kernel (a regular file, at most --mem).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initrd: Option<PathBuf>,
    /// Kernel command line for --kernel (virtio_mmio.device= words for the
    /// devices are appended, see --virtio-announce) [default: console=ttyS0
    /// earlyprintk=serial,ttyS0,115200 panic=-1].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    /// How a Linux guest learns about the --disk and --balloon devices:
    /// ACPI DSDT entries (what stock distribution kernels read),
    /// virtio_mmio.device= words on the command line (kernels built with
    /// CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES), or both.
    /// [default: both]
    #[arg(long, value_enum)]
    #[serde(with = "announce", skip_serializing_if = "Option::is_none")]
    pub virtio_announce: Option<VirtioAnnounce>,
    /// virtio-blk disk: a raw image, PATH[,readonly], or an NBD export,
    /// nbd://HOST[:PORT]/EXPORT[,readonly][,timeout=SECONDS] or
    /// nbd+unix:///EXPORT?socket=PATH[,...], or a vhost-user-blk backend's
    /// device, vhost-user-blk:SOCKET[,readonly][,timeout=SECONDS]; repeat
    /// for more (in the file: a list).
    #[arg(long = "disk")]
    #[serde(rename = "disk", with = "disks", skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<DiskSpec>,
    /// Add a virtio-balloon device (free page reporting drops whole free
    /// 2 MiB chunks); --balloon=false turns off a file's.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balloon: Option<bool>,
    /// Initial balloon target: how much guest RAM the guest is asked to
    /// give back (a multiple of 4K, at most --mem; e.g. 256M). Change it
    /// later with `hugevmm ctl ... balloon SIZE` (PUT /balloon).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    #[serde(with = "size", skip_serializing_if = "Option::is_none")]
    pub balloon_target: Option<u64>,
    /// Serve the HTTP API at PATH (a Unix socket) while the VM runs (routes
    /// in docs/api.yaml: GET /vm, /stats, /metrics, /balloon; PUT
    /// /balloon, /mem-limit, /actions); talk to it with `hugevmm ctl
    /// --api-socket PATH` or `curl --unix-socket PATH`. A stale socket
    /// there is replaced; the file is removed when the VM ends.
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_socket: Option<PathBuf>,
    /// Also serve --api-socket to clients running as this uid (a number;
    /// repeat for more; in the file: a list). Without it only the uid that
    /// started the VM and root are served (checked on every connection,
    /// SO_PEERCRED); others get a 403. The socket file stays mode 0600:
    /// give the other user a way to it (its mode, or a directory).
    #[arg(long, value_name = "UID")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub api_allow_uid: Vec<u32>,
    /// Serve GET /metrics (Prometheus) on this TCP address while the VM
    /// runs, e.g. 127.0.0.1:9800 (a host name is resolved when the options
    /// are read: localhost:9800 serves 127.0.0.1:9800); nothing else is
    /// served there.
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_metrics_addr)]
    #[serde(with = "metrics_addr", skip_serializing_if = "Option::is_none")]
    pub metrics_addr: Option<SocketAddr>,
    /// Write the Linux serial console to this file instead of stdout.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub console_log: Option<PathBuf>,
    /// Most bytes of guest output --console-log keeps (e.g. 1M); past it
    /// one line says the log was cut and the rest is dropped, so that a
    /// guest cannot fill the disk [default: 64M].
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    #[serde(with = "size", skip_serializing_if = "Option::is_none")]
    pub console_log_max: Option<u64>,
    /// Argument string passed verbatim to the payload (`key=value` words).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_args: Option<String>,
    /// Write run statistics as a JSON object to this file.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats_json: Option<PathBuf>,
    /// Write how the run ended to this file, as one JSON object:
    /// `{"exit_status":N,"exit_kind":"payload|quit|config|timeout|vm-failure|signal","message":...}`
    /// (a payload can exit with any status, so the number alone cannot say).
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_file: Option<PathBuf>,
    /// End the run (exit 124) if the payload has not finished after this many seconds.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    /// Cap resident guest RAM at SIZE, swapping the rest to --swap-store
    /// (starts the swap engine). A multiple of the swap unit, at least
    /// 8 MiB per vCPU + 8 MiB; `none` starts the engine without a cap;
    /// `auto[=stall:PCT]` sizes the cap from the guest's memory stall,
    /// aiming at PCT % of the time (default 2), within --mem-limit-min and
    /// --mem-limit-max. Changeable at run time through --api-socket
    /// (`hugevmm ctl ... mem-limit SIZE|none`, PUT /mem-limit; a fixed
    /// limit set there ends auto sizing).
    #[arg(long, value_name = "SIZE|none|auto[=stall:PCT]", value_parser = parse_mem_limit)]
    #[serde(with = "mem_limit", skip_serializing_if = "Option::is_none")]
    pub mem_limit: Option<MemLimit>,
    /// With `--mem-limit auto`: the smallest limit it may set (default:
    /// what the vCPUs need, 8 MiB per vCPU + 8 MiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    #[serde(with = "size", skip_serializing_if = "Option::is_none")]
    pub mem_limit_min: Option<u64>,
    /// With `--mem-limit auto`: the largest limit it may set, and the one
    /// it starts from (default: --mem).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    #[serde(with = "size", skip_serializing_if = "Option::is_none")]
    pub mem_limit_max: Option<u64>,
    /// Where evicted guest RAM goes: default (an unlinked O_DIRECT file in
    /// $TMPDIR or /var/tmp), file:PATH[,size=SIZE], mem:lz4[,size=SIZE],
    /// mem:zstd[,size=SIZE], vhost-user-blk:SOCKET[,queues=N][,size=SIZE][,timeout=SECONDS],
    /// nbd://HOST[:PORT]/EXPORT[,size=SIZE][,timeout=SECONDS],
    /// nbd+unix:///EXPORT?socket=PATH[,...]. Giving a store starts the swap engine.
    #[arg(long)]
    #[serde(with = "text", skip_serializing_if = "Option::is_none")]
    pub swap_store: Option<StoreSpec>,
    /// Encrypt and authenticate everything written to --swap-store
    /// (AES-256-GCM per 2 MiB slot or 4 KiB page, under a random per-run
    /// key, or a subkey of --swap-key-file): whoever reads the store reads
    /// no guest memory, whoever writes it cannot feed the guest forged
    /// memory (docs/ENCRYPTION.md). On by default for an NBD store;
    /// --swap-encrypt=false turns it off (with a warning for NBD) or turns
    /// off a file's.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_encrypt: Option<bool>,
    /// With --swap-encrypt: derive the run's key from this operator key (a
    /// regular file of exactly 32 random bytes, yours or root's, that only
    /// its owner may read: no permission bits for group or others, e.g.
    /// mode 0600 or 0400) and a random per-run salt, instead of a random
    /// key.
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_key_file: Option<PathBuf>,
    /// Swap unit: auto (2 MiB chunks, each split into 4 KiB pages while
    /// its use is sparse and collapsed back when dense), 2m (whole 2 MiB
    /// chunks, restored as huge mappings) or 4k (the per-page baseline)
    /// [default: auto].
    #[arg(long)]
    #[serde(with = "text", skip_serializing_if = "Option::is_none")]
    pub swap_unit: Option<SwapUnit>,
    /// Threads serving guest memory faults (swap engine), 1 to 32
    /// [default: 1].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault_threads: Option<usize>,
    /// Nice value of the fault threads, -20 to 19; below 0 they are served
    /// before the vCPU threads when vCPUs outnumber cores (needs root; 0 =
    /// same as vCPUs) [default: -10].
    #[arg(long, allow_hyphen_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault_thread_nice: Option<i32>,
    /// Write a sample of the run's figures (resident memory, faults, KVM
    /// mappings) every --stats-interval milliseconds to this file, one JSON
    /// object per line.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats_timeline: Option<PathBuf>,
    /// Sampling interval for --stats-timeline, in milliseconds, 1 to
    /// 3600000 [default: 100].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats_interval: Option<u64>,
    /// After the payload finished, evict all guest RAM to the store and
    /// report how long it took (`pageout` in --stats-json); --pageout=false
    /// turns off a file's.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pageout: Option<bool>,
    /// Test knob (docs/SPLIT_CHUNKS.md): every Nth restore of a huge chunk
    /// splits it into 4 KiB pages and every Nth page fault on a split chunk
    /// tries to collapse it again, 1 to 1000000. Needs --swap-unit 2m and
    /// --backing thp.
    #[arg(long, hide = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub force_split_every: Option<u32>,
    /// Sequential prefetch of the auto unit (docs/GRANULARITY.md): a fault
    /// that continues a stream reads the stream's next chunk ahead, in the
    /// limit's headroom; --prefetch=false turns it off, to measure what it
    /// buys [default: true].
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<bool>,
    /// Estimate the guest's working set by sampling (docs/ARCHITECTURE.md,
    /// "Working-set estimation"): take this many resident units a second
    /// out to the store and count those that fault back within the window
    /// (--working-set-window-ms, 10 s unless given). The
    /// estimate and the memory idle for 10, 60 and 300 s are in the stats
    /// and metrics; idle samples stay in the store. 2 is a good start
    /// [default: off].
    #[arg(long, value_name = "UNITS_PER_S")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_sampling: Option<f64>,
    /// With --working-set-sampling: a sample that faults back within this
    /// many milliseconds was active. A shorter window counts memory the
    /// guest touches less often than once a window as idle, and lets the
    /// estimate follow a change sooner [default: 10000].
    #[arg(long, value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_window_ms: Option<u64>,
    /// With --working-set-sampling: the estimate is the mean over the
    /// samples whose window ended within this many milliseconds. A shorter
    /// horizon follows a change sooner, from fewer samples (a wider
    /// standard error, which the stats give) [default: 60000].
    #[arg(long, value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_horizon_ms: Option<u64>,
    /// Run without the per-thread seccomp filters (docs/SECURITY.md), for
    /// debugging: e.g. under strace, or to tell whether a failure is a
    /// system call the filters lack; --no-seccomp=false turns off a file's.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_seccomp: Option<bool>,
    /// Leave the process dumpable: by default hugevmm makes itself
    /// non-dumpable (PR_SET_DUMPABLE 0) once the machine is built, so that
    /// it leaves no core dump of guest memory and other processes of the
    /// same user cannot ptrace it or read its /proc/PID/mem; --dumpable
    /// keeps the default of the process (for gdb -p or a core dump, when
    /// debugging); --dumpable=false turns off a file's.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dumpable: Option<bool>,
    /// No status line: on a terminal, a run prints one line every few
    /// seconds on stderr (resident memory, faults, store I/O) until it
    /// ends; --quiet leaves it out (it is off anyway when stderr is not a
    /// terminal); --quiet=false turns off a file's.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quiet: Option<bool>,
}

impl RunFlags {
    /// These flags over `file`: each option given here wins. The guest is
    /// one choice (--payload, --payload-file or --kernel): naming one here
    /// replaces the file's, whichever it was.
    fn over(self, file: RunFlags) -> RunFlags {
        // Destructured, not `..`: a new flag that is not merged here does
        // not compile.
        let RunFlags {
            config,
            mem,
            vcpus,
            backing,
            payload,
            payload_file,
            kernel,
            initrd,
            cmdline,
            virtio_announce,
            disks,
            balloon,
            balloon_target,
            api_socket,
            api_allow_uid,
            metrics_addr,
            console_log,
            console_log_max,
            payload_args,
            stats_json,
            status_file,
            timeout,
            mem_limit,
            mem_limit_min,
            mem_limit_max,
            swap_store,
            swap_encrypt,
            swap_key_file,
            swap_unit,
            fault_threads,
            fault_thread_nice,
            stats_timeline,
            stats_interval,
            pageout,
            force_split_every,
            prefetch,
            working_set_sampling,
            working_set_window_ms,
            working_set_horizon_ms,
            no_seccomp,
            dumpable,
            quiet,
        } = self;
        let guest_given = payload.is_some() || payload_file.is_some() || kernel.is_some();
        // The file's options that describe its guest go with it when
        // these flags name a guest of the other kind: a payload named over
        // a file's Linux guest leaves out its initrd, command line and
        // console, a kernel over a file's payload its arguments.
        let kernel_given = kernel.is_some();
        let file_is_kernel = file.kernel.is_some();
        let same_kind = !guest_given || kernel_given == file_is_kernel;
        let mut file = file;
        let (file_payload, file_payload_file, file_kernel) = if guest_given {
            (None, None, None)
        } else {
            (
                file.payload.take(),
                file.payload_file.take(),
                file.kernel.take(),
            )
        };
        let file = RunFlags {
            initrd: file.initrd.filter(|_| same_kind),
            cmdline: file.cmdline.filter(|_| same_kind),
            virtio_announce: file.virtio_announce.filter(|_| same_kind),
            console_log: file.console_log.filter(|_| same_kind),
            console_log_max: file.console_log_max.filter(|_| same_kind),
            payload_args: file.payload_args.filter(|_| same_kind),
            ..file
        };
        RunFlags {
            config,
            mem: mem.or(file.mem),
            vcpus: vcpus.or(file.vcpus),
            backing: backing.or(file.backing),
            payload: payload.or(file_payload),
            payload_file: payload_file.or(file_payload_file),
            kernel: kernel.or(file_kernel),
            initrd: initrd.or(file.initrd),
            cmdline: cmdline.or(file.cmdline),
            virtio_announce: virtio_announce.or(file.virtio_announce),
            disks: if disks.is_empty() { file.disks } else { disks },
            balloon: balloon.or(file.balloon),
            balloon_target: balloon_target.or(file.balloon_target),
            api_socket: api_socket.or(file.api_socket),
            api_allow_uid: if api_allow_uid.is_empty() {
                file.api_allow_uid
            } else {
                api_allow_uid
            },
            metrics_addr: metrics_addr.or(file.metrics_addr),
            console_log: console_log.or(file.console_log),
            console_log_max: console_log_max.or(file.console_log_max),
            payload_args: payload_args.or(file.payload_args),
            stats_json: stats_json.or(file.stats_json),
            status_file: status_file.or(file.status_file),
            timeout: timeout.or(file.timeout),
            mem_limit: mem_limit.or(file.mem_limit),
            mem_limit_min: mem_limit_min.or(file.mem_limit_min),
            mem_limit_max: mem_limit_max.or(file.mem_limit_max),
            swap_store: swap_store.or(file.swap_store),
            swap_encrypt: swap_encrypt.or(file.swap_encrypt),
            swap_key_file: swap_key_file.or(file.swap_key_file),
            swap_unit: swap_unit.or(file.swap_unit),
            fault_threads: fault_threads.or(file.fault_threads),
            fault_thread_nice: fault_thread_nice.or(file.fault_thread_nice),
            stats_timeline: stats_timeline.or(file.stats_timeline),
            stats_interval: stats_interval.or(file.stats_interval),
            pageout: pageout.or(file.pageout),
            force_split_every: force_split_every.or(file.force_split_every),
            prefetch: prefetch.or(file.prefetch),
            working_set_sampling: working_set_sampling.or(file.working_set_sampling),
            working_set_window_ms: working_set_window_ms.or(file.working_set_window_ms),
            working_set_horizon_ms: working_set_horizon_ms.or(file.working_set_horizon_ms),
            no_seccomp: no_seccomp.or(file.no_seccomp),
            dumpable: dumpable.or(file.dumpable),
            quiet: quiet.or(file.quiet),
        }
    }
}

/// `hugevmm run`'s options, merged and with their defaults.
pub struct RunArgs {
    /// Guest RAM size.
    pub mem: u64,
    /// vCPU count.
    pub vcpus: u32,
    /// Guest RAM backing.
    pub backing: Backing,
    /// The options as given, defaults left out (`GET /vm`).
    pub given: serde_json::Value,
    /// The rest, as given.
    pub flags: RunFlags,
}

impl RunArgs {
    /// Whether the VM gets a balloon.
    pub fn balloon(&self) -> bool {
        self.flags.balloon.unwrap_or(false)
    }

    /// Whether to page out after the payload.
    pub fn pageout(&self) -> bool {
        self.flags.pageout.unwrap_or(false)
    }

    /// Whether swapped memory is sealed: `--swap-encrypt`, on by default
    /// when the store is an NBD export (the pages leave the host, and a
    /// crc32 is no protection against whoever serves or carries them).
    pub fn swap_encrypt(&self) -> bool {
        self.flags
            .swap_encrypt
            .unwrap_or_else(|| self.swaps_to_nbd())
    }

    /// Whether the swap store is an NBD export.
    pub fn swaps_to_nbd(&self) -> bool {
        matches!(self.flags.swap_store, Some(StoreSpec::Nbd { .. }))
    }

    /// A warning for a remote store left unsealed on purpose
    /// (`--swap-encrypt=false` on an NBD store).
    pub fn unsealed_remote_store_warning(&self) -> Option<String> {
        (self.swaps_to_nbd() && !self.swap_encrypt()).then(|| {
            "--swap-encrypt=false on an NBD store: every swapped page goes to the NBD \
             server in plaintext, protected only by a crc32 that the server or anyone on \
             the path can recompute after changing the page (a write into guest memory); \
             drop --swap-encrypt=false to seal the pages (AES-256-GCM, the default for NBD)"
                .to_string()
        })
    }

    /// A warning for each NBD store or disk reached over a network without
    /// TLS (`nbd://` to a host that is not loopback): whoever is on the
    /// path sees which parts of the export are read and written and when,
    /// a disk's data in the clear, and can cut or stall the connection.
    pub fn clear_network_link_warnings(&self) -> Vec<String> {
        let store = match &self.flags.swap_store {
            Some(StoreSpec::Nbd { uri, .. }) => Some((uri, "swap store")),
            _ => None,
        };
        let disks = self
            .flags
            .disks
            .iter()
            .filter_map(|d| d.nbd.as_ref().map(|n| (&n.uri, "disk")));
        store
            .into_iter()
            .chain(disks)
            .filter(|(uri, _)| uri.in_the_clear_over_a_network())
            .map(|(uri, what)| {
                format!(
                    "the NBD {what} {uri} is reached over the network without TLS: anyone on the path sees which blocks are read and written{}, and can cut the connection; serve it with TLS (nbdkit --tls=require, qemu-nbd --tls-creds) and write nbds://",
                    if what == "disk" { " and their data" } else { " and when" }
                )
            })
            .collect()
    }

    /// Whether the threads get their seccomp filters (the default).
    pub fn seccomp(&self) -> bool {
        !self.flags.no_seccomp.unwrap_or(false)
    }

    /// Whether the process stays dumpable (`--dumpable`).
    pub fn dumpable(&self) -> bool {
        self.flags.dumpable.unwrap_or(false)
    }

    /// Whether the status line is left out (`--quiet`).
    pub fn quiet(&self) -> bool {
        self.flags.quiet.unwrap_or(false)
    }
}

/// Reads and parses a `--config` file.
pub fn read_config(path: &std::path::Path) -> Result<RunFlags> {
    let shown = path.display();
    let (file, _) = crate::input_file::open_checked(
        "--config",
        path,
        MAX_CONFIG_BYTES,
        "a VM description (a few hundred bytes of JSON)",
    )?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_CONFIG_BYTES), &mut text)
        .with_context(|| format!("cannot read --config {shown} (it must be UTF-8 JSON)"))?;
    serde_json::from_str(&text).with_context(|| {
        format!("--config {shown} is not a VM description: the keys are the flags of `hugevmm run` without their dashes, e.g. {{\"mem\": \"1G\", \"vcpus\": 2, \"payload\": \"verify\"}}")
    })
}

/// The flags over the `--config` file (if any), with defaults.
pub fn resolve(flags: RunFlags) -> Result<RunArgs> {
    let file = match &flags.config {
        Some(path) => read_config(path)?,
        None => RunFlags::default(),
    };
    let flags = flags.over(file);
    let guests = [
        flags.payload.is_some(),
        flags.payload_file.is_some(),
        flags.kernel.is_some(),
    ];
    match guests.iter().filter(|g| **g).count() {
        0 => bail!("nothing to run: give --payload NAME, --payload-file PATH or --kernel PATH (or \"payload\", \"payload-file\" or \"kernel\" in --config)"),
        1 => {}
        _ => bail!("--payload, --payload-file and --kernel each name what to run: give only one of them"),
    }
    let given = serde_json::to_value(&flags).context("the options do not serialize")?;
    Ok(RunArgs {
        mem: flags.mem.unwrap_or(DEFAULT_MEM_BYTES),
        vcpus: flags.vcpus.unwrap_or(1),
        backing: flags.backing.unwrap_or_default(),
        given,
        flags,
    })
}

/// A size: a number of bytes, or a string with K/M/G as on the command line.
mod size {
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(n) => s.serialize_u64(*n),
            None => s.serialize_none(),
        }
    }

    struct Size;

    impl Visitor<'_> for Size {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a size: a number of bytes or a string such as \"512M\"")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            guestmem::parse_size(v).map(Some).map_err(E::custom)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        d.deserialize_any(Size)
    }
}

/// `mem-limit`: a size (a number of bytes or a string with K/M/G), or
/// `"none"` for the engine without a cap.
mod mem_limit {
    use super::MemLimit;
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<MemLimit>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(MemLimit::Bytes(n)) => s.serialize_u64(*n),
            Some(MemLimit::Unlimited) => s.serialize_str(super::NO_LIMIT),
            Some(MemLimit::Auto { stall_pct }) => {
                s.serialize_str(&format!("{}=stall:{stall_pct}", super::AUTO_LIMIT))
            }
            None => s.serialize_none(),
        }
    }

    struct Limit;

    impl Visitor<'_> for Limit {
        type Value = Option<MemLimit>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a size (a number of bytes or a string such as \"512M\"), \"none\" or \"auto[=stall:PCT]\"")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(MemLimit::Bytes(v)))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            super::parse_mem_limit(v).map(Some).map_err(E::custom)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<MemLimit>, D::Error> {
        d.deserialize_any(Limit)
    }
}

/// `metrics-addr`: as the flag takes it (a host name is resolved).
mod metrics_addr {
    use serde::{de, Deserialize, Deserializer, Serializer};
    use std::net::SocketAddr;

    pub fn serialize<S: Serializer>(v: &Option<SocketAddr>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(addr) => s.collect_str(addr),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(text) => super::parse_metrics_addr(&text)
                .map(Some)
                .map_err(de::Error::custom),
            None => Ok(None),
        }
    }
}

/// A value written as on the command line (its `FromStr` and `Display`).
mod text {
    use serde::{de, Deserialize, Deserializer, Serializer};
    use std::fmt::Display;
    use std::str::FromStr;

    pub fn serialize<T: Display, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        match Option::<String>::deserialize(d)? {
            Some(text) => text.parse().map(Some).map_err(de::Error::custom),
            None => Ok(None),
        }
    }
}

/// `virtio-announce`: the flag's value names.
mod announce {
    use crate::linux::VirtioAnnounce;
    use clap::ValueEnum;
    use serde::{de, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<VirtioAnnounce>, s: S) -> Result<S::Ok, S::Error> {
        match v.and_then(|v| v.to_possible_value()) {
            Some(value) => s.serialize_str(value.get_name()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<VirtioAnnounce>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(text) => VirtioAnnounce::from_str(&text, false)
                .map(Some)
                .map_err(de::Error::custom),
            None => Ok(None),
        }
    }
}

/// `disk`: a list of `PATH[,readonly]` strings.
mod disks {
    use devices::virtio::DiskSpec;
    use serde::{de, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[DiskSpec], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|d| d.to_string()))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<DiskSpec>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|text| text.parse().map_err(de::Error::custom))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: RunFlags,
    }

    fn flags(args: &[&str]) -> RunFlags {
        Cli::try_parse_from(std::iter::once("run").chain(args.iter().copied()))
            .unwrap()
            .flags
    }

    fn file(json: &str) -> Result<RunFlags, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn every_flag_has_a_key_and_round_trips() {
        let all = flags(&[
            "--mem",
            "1G",
            "--vcpus",
            "2",
            "--backing",
            "hugetlb",
            "--kernel",
            "/k",
            "--initrd",
            "/i",
            "--cmdline",
            "console=ttyS0",
            "--virtio-announce",
            "acpi",
            "--disk",
            "/d1",
            "--disk",
            "/d2,readonly",
            "--balloon",
            "--balloon-target",
            "4M",
            "--api-socket",
            "/s",
            "--api-allow-uid",
            "1000",
            "--api-allow-uid",
            "1001",
            "--metrics-addr",
            "127.0.0.1:9800",
            "--console-log",
            "/c",
            "--console-log-max",
            "1M",
            "--stats-json",
            "/j",
            "--status-file",
            "/f",
            "--timeout",
            "5",
            "--mem-limit",
            "256M",
            "--mem-limit-min",
            "64M",
            "--mem-limit-max",
            "512M",
            "--swap-store",
            "mem:lz4",
            "--swap-encrypt",
            "--swap-key-file",
            "/key",
            "--swap-unit",
            "4k",
            "--fault-threads",
            "2",
            "--fault-thread-nice",
            "-5",
            "--stats-timeline",
            "/t",
            "--stats-interval",
            "50",
            "--pageout",
            "--force-split-every",
            "3",
            "--prefetch=false",
            "--working-set-sampling",
            "4",
            "--working-set-window-ms",
            "2000",
            "--working-set-horizon-ms",
            "6000",
            "--no-seccomp",
            "--dumpable",
            "--quiet",
        ]);
        let json = serde_json::to_value(&all).unwrap();
        // Every flag but --config (a file cannot name another) and the
        // payload's (the kernel is the guest here) is in the file, under
        // its own name.
        use clap::CommandFactory;
        for arg in Cli::command().get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if ["config", "payload", "payload-file", "payload-args"].contains(&long) {
                continue;
            }
            assert!(json.get(long).is_some(), "--{long} has no key: {json}");
        }
        assert_eq!(json["mem"], 1 << 30);
        assert_eq!(json["disk"][1], "/d2,readonly");
        assert_eq!(json["virtio-announce"], "acpi");
        assert_eq!(json["metrics-addr"], "127.0.0.1:9800");
        assert_eq!(json["no-seccomp"], true);
        assert_eq!(json["api-allow-uid"], serde_json::json!([1000, 1001]));
        assert_eq!(json["console-log-max"], 1 << 20);
        assert_eq!(json["dumpable"], true);
        assert_eq!(json["quiet"], true);
        let again: RunFlags = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(serde_json::to_value(&again).unwrap(), json);
        let payload = flags(&["--payload", "hello", "--payload-args", "a=1"]);
        let json = serde_json::to_value(&payload).unwrap();
        assert_eq!(
            json,
            serde_json::json!({ "payload": "hello", "payload-args": "a=1" })
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let err = file(r#"{"memory": "1G"}"#).unwrap_err().to_string();
        assert!(
            err.contains("unknown field `memory`") && err.contains("`mem`"),
            "{err}"
        );
        let err = file(r#"{"mem": "lots"}"#).unwrap_err().to_string();
        assert!(err.contains("lots"), "{err}");
        let err = file(r#"{"backing": "huge"}"#).unwrap_err().to_string();
        assert!(err.contains("huge"), "{err}");
        let err = file(r#"{"config": "other.json"}"#).unwrap_err().to_string();
        assert!(err.contains("unknown field `config`"), "{err}");
        assert_eq!(file(r#"{"mem": 67108864}"#).unwrap().mem, Some(64 << 20));
        assert_eq!(file(r#"{"mem": "64M"}"#).unwrap().mem, Some(64 << 20));
    }

    #[test]
    fn flags_override_the_file() {
        let from_file = file(
            r#"{"mem": "1G", "vcpus": 4, "payload": "verify", "balloon": true, "disk": ["/a"]}"#,
        )
        .unwrap();
        let merged = flags(&["--vcpus", "2", "--balloon=false"]).over(from_file.clone());
        assert_eq!(merged.mem, Some(1 << 30));
        assert_eq!(merged.vcpus, Some(2));
        assert_eq!(merged.balloon, Some(false));
        assert_eq!(merged.payload.as_deref(), Some("verify"));
        assert_eq!(merged.disks.len(), 1);
        // Naming another guest replaces the file's.
        let merged = flags(&["--kernel", "/vmlinuz"]).over(from_file);
        assert!(merged.payload.is_none());
        assert_eq!(merged.kernel, Some(PathBuf::from("/vmlinuz")));
    }

    #[test]
    fn a_guest_of_the_other_kind_leaves_out_the_file_s_guest_options() {
        let linux = file(
            r#"{"kernel": "/vmlinuz", "initrd": "/initrd.img", "cmdline": "console=ttyS0",
                "virtio-announce": "acpi", "console-log": "console.log", "mem": "1G"}"#,
        )
        .unwrap();
        let merged = flags(&["--payload", "hello"]).over(linux.clone());
        assert_eq!(merged.payload.as_deref(), Some("hello"));
        assert!(merged.kernel.is_none() && merged.initrd.is_none());
        assert!(merged.cmdline.is_none() && merged.virtio_announce.is_none());
        assert!(merged.console_log.is_none());
        assert_eq!(merged.mem, Some(1 << 30), "the rest of the file stays");
        let args = resolve(flags(&["--payload", "hello"]).over(linux.clone()));
        assert!(args.is_ok(), "{:?}", args.err());
        // Another kernel keeps the file's initrd and command line.
        let merged = flags(&["--kernel", "/other"]).over(linux);
        assert_eq!(merged.cmdline.as_deref(), Some("console=ttyS0"));
        let payload = file(r#"{"payload": "verify", "payload-args": "passes=3"}"#).unwrap();
        let merged = flags(&["--kernel", "/vmlinuz"]).over(payload.clone());
        assert!(merged.payload_args.is_none());
        let merged = flags(&["--payload", "seqwrite"]).over(payload);
        assert_eq!(merged.payload_args.as_deref(), Some("passes=3"));
    }

    #[test]
    fn defaults_and_the_guest_choice() {
        let args = resolve(flags(&["--payload", "hello"])).unwrap();
        assert_eq!(
            (args.mem, args.vcpus, args.backing),
            (512 << 20, 1, Backing::Thp)
        );
        assert!(!args.balloon() && !args.pageout());
        assert_eq!(args.given, serde_json::json!({ "payload": "hello" }));
        let err = resolve(flags(&[])).err().unwrap().to_string();
        assert!(err.contains("nothing to run"), "{err}");
        let err = resolve(flags(&["--payload", "a", "--kernel", "/k"]))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("only one"), "{err}");
    }

    /// `none`, which the limit's errors and `hugevmm ctl mem-limit` offer,
    /// is taken by the flag and the file: the engine without a cap.
    #[test]
    fn mem_limit_none_is_the_engine_without_a_cap() {
        let given = flags(&["--mem-limit", "none"]);
        assert_eq!(given.mem_limit, Some(MemLimit::Unlimited));
        assert_eq!(given.mem_limit.unwrap().bytes(), None);
        let json = serde_json::to_value(&given).unwrap();
        assert_eq!(json["mem-limit"], "none");
        let again: RunFlags = serde_json::from_value(json).unwrap();
        assert_eq!(again.mem_limit, Some(MemLimit::Unlimited));
        assert_eq!(
            file(r#"{"mem-limit": "none"}"#).unwrap().mem_limit,
            Some(MemLimit::Unlimited)
        );
        assert_eq!(
            file(r#"{"mem-limit": "256M"}"#).unwrap().mem_limit,
            Some(MemLimit::Bytes(256 << 20))
        );
        assert_eq!(
            flags(&["--mem-limit", "1.5G"]).mem_limit,
            Some(MemLimit::Bytes(1536 << 20))
        );
        let err = file(r#"{"mem-limit": "lots"}"#).unwrap_err().to_string();
        assert!(err.contains("lots") && err.contains("`none`"), "{err}");
    }

    /// `auto` and `auto=stall:PCT` read from the flag and a config file,
    /// and write back as what they read.
    #[test]
    fn mem_limit_auto_takes_a_stall_target() {
        let given = flags(&["--mem-limit", "auto"]);
        assert_eq!(
            given.mem_limit,
            Some(MemLimit::Auto {
                stall_pct: DEFAULT_STALL_PCT
            })
        );
        assert_eq!(given.mem_limit.unwrap().bytes(), None);
        let json = serde_json::to_value(&given).unwrap();
        assert_eq!(json["mem-limit"], "auto=stall:2");
        let again: RunFlags = serde_json::from_value(json).unwrap();
        assert_eq!(again.mem_limit, given.mem_limit);
        assert_eq!(
            file(r#"{"mem-limit": "auto=stall:5%", "mem-limit-max": "1G"}"#)
                .unwrap()
                .mem_limit,
            Some(MemLimit::Auto { stall_pct: 5.0 })
        );
        for bad in ["auto=stall:0", "auto=stall:75", "auto=stall:x", "auto=fast"] {
            let err = parse_mem_limit(bad).unwrap_err();
            assert!(err.contains("auto=stall:PCT"), "{bad}: {err}");
        }
    }

    /// The CLI's sizes follow the one rule the payloads' arguments follow
    /// too (payloads/tests/host_run.rs holds the SDK to guestmem's parser).
    #[test]
    fn sizes_take_fractions_that_make_whole_bytes() {
        assert_eq!(flags(&["--mem", "1.5G"]).mem, Some(1536 << 20));
        assert_eq!(file(r#"{"mem": "1.5G"}"#).unwrap().mem, Some(1536 << 20));
        let err = Cli::try_parse_from(["run", "--mem", "1.3K"]).err().unwrap();
        assert!(
            err.to_string().contains("not a whole number of bytes"),
            "{err}"
        );
        assert!(Cli::try_parse_from(["run", "--mem", "0x1000"]).is_err());
    }

    /// A host name is resolved; what is expected is said otherwise.
    #[test]
    fn metrics_addr_takes_host_names_and_says_what_it_expects() {
        let addr = flags(&["--metrics-addr", "localhost:9800"]).metrics_addr;
        assert_eq!(addr, Some("127.0.0.1:9800".parse().unwrap()));
        assert_eq!(
            file(r#"{"metrics-addr": "localhost:9800"}"#)
                .unwrap()
                .metrics_addr,
            addr
        );
        assert_eq!(
            flags(&["--metrics-addr", "[::1]:9800"]).metrics_addr,
            Some("[::1]:9800".parse().unwrap())
        );
        for (bad, why) in [
            ("localhost", "has no port"),
            ("127.0.0.1", "has no port"),
            ("localhost:http", "is not a port"),
            ("127.0.0.1:99999", "is not a port"),
            (":9800", "is not an address"),
        ] {
            let err = Cli::try_parse_from(["run", "--metrics-addr", bad])
                .err()
                .unwrap()
                .to_string();
            assert!(
                err.contains(why) && err.contains("e.g. 127.0.0.1:9800"),
                "{bad}: {err}"
            );
        }
    }

    /// The key file's modes are said one way where they are said: what
    /// `swap::store::Sealer::from_key_file` checks (no bit for group or
    /// others), in --help and in README.md's option table.
    #[test]
    fn the_key_file_modes_read_the_same_in_help_and_readme() {
        use clap::CommandFactory;
        let rule = "no permission bits for group or others, e.g. mode 0600 or 0400";
        let help = Cli::command()
            .get_arguments()
            .find(|a| a.get_long() == Some("swap-key-file"))
            .and_then(|a| a.get_help())
            .map(|h| h.to_string().replace('\n', " "))
            .unwrap();
        assert!(help.contains(rule), "{help}");
        let readme =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
        let row = readme
            .lines()
            .find(|l| l.starts_with("| `--swap-key-file PATH` |"))
            .expect("README.md has the --swap-key-file row");
        assert!(row.contains(rule), "{row}");
    }

    #[test]
    fn plain_nbd_beyond_loopback_is_warned_about_once_per_store_and_disk() {
        let warned = |args: &[&str]| {
            let mut all = vec!["--payload", "hello"];
            all.extend_from_slice(args);
            resolve(flags(&all)).unwrap().clear_network_link_warnings()
        };
        let w = warned(&[
            "--swap-store",
            "nbd://10.0.0.2/swap",
            "--disk",
            "nbd://storage.example/disk",
            "--disk",
            "nbd://127.0.0.1/local",
        ]);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("swap store nbd://10.0.0.2/swap") && w[0].contains("nbds://"));
        assert!(w[1].contains("disk nbd://storage.example/disk") && w[1].contains("their data"));
        assert!(warned(&["--swap-store", "nbds://10.0.0.2/swap"]).is_empty());
        assert!(warned(&["--swap-store", "nbd://[::1]/swap"]).is_empty());
        assert!(warned(&["--swap-store", "nbd+unix:///x?socket=/s"]).is_empty());
    }
}
