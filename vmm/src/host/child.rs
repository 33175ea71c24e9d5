//! One VM of `hugevmm host`: a `hugevmm run` process of its own (its own
//! seccomp filters, its own API socket), started from the VM's config
//! file, read and steered only through its API.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::control::client::{call, Reply};
use crate::control::command::ApiRequest;

/// How long one API call of the supervisor may take: a VM that does not
/// answer within it keeps its limit until the next period.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// What the supervisor reads of a VM each period.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    /// Its limit now.
    pub limit_bytes: u64,
    /// Its resident guest RAM.
    pub resident_bytes: u64,
    /// Its working-set estimate, when it has one yet.
    pub estimate_bytes: Option<u64>,
    /// Its vCPUs' waits so far on faults a larger limit would have spared
    /// (refaults, not first touches: `auto_limit::refault_wait_us`), µs
    /// per vCPU.
    pub stall_us: u64,
    /// When it was read.
    pub at: Option<Instant>,
}

/// A running (or ended) VM.
pub struct ChildVm {
    /// Its name: the config file's stem, made unique.
    pub name: String,
    /// Its config file.
    pub config: PathBuf,
    /// Its API socket.
    pub socket: PathBuf,
    /// Its `--stats-json`.
    pub stats_path: PathBuf,
    /// Its stdout and stderr, in the state folder.
    pub log_paths: (PathBuf, PathBuf),
    /// Its guest RAM.
    pub mem_bytes: u64,
    /// The least limit it gets.
    pub floor_bytes: u64,
    /// Its limit: the last one set, or read.
    pub limit_bytes: u64,
    /// Whether it has a balloon the supervisor steers (`--balloons`).
    pub balloon: bool,
    /// The balloon target last set.
    pub balloon_target_bytes: Option<u64>,
    process: Child,
    /// Its exit status, once it ended.
    pub ended: Option<ExitStatus>,
    /// The reading before the last, for the stall over one period.
    pub previous: Option<Reading>,
    /// The last reading.
    pub last: Option<Reading>,
}

/// How a VM is started.
pub struct Launch<'a> {
    /// The `hugevmm` binary.
    pub binary: &'a Path,
    /// The VM's config file.
    pub config: &'a Path,
    /// Its name.
    pub name: String,
    /// Where its socket, stats and logs go.
    pub state_dir: &'a Path,
    /// Its guest RAM and floor.
    pub mem_bytes: u64,
    /// The least limit it gets.
    pub floor_bytes: u64,
    /// Its first limit.
    pub limit_bytes: u64,
    /// `--working-set-sampling` for it; None: off.
    pub sampling: Option<f64>,
    /// Its balloon is steered with its limit.
    pub balloon: bool,
}

impl ChildVm {
    /// Starts the VM: `hugevmm run --config CONFIG` with its first limit,
    /// an API socket, a stats file and its output in the state folder.
    pub fn start(launch: Launch<'_>) -> Result<ChildVm> {
        let dir = launch.state_dir;
        let name = launch.name;
        let socket = dir.join(format!("{name}.sock"));
        let stats_path = dir.join(format!("{name}.stats.json"));
        let out_path = dir.join(format!("{name}.out"));
        let err_path = dir.join(format!("{name}.err"));
        let create = |path: &Path| {
            File::create(path).with_context(|| format!("cannot create {}", path.display()))
        };
        let mut command = Command::new(launch.binary);
        command
            .arg("run")
            .arg("--config")
            .arg(launch.config)
            .arg("--mem-limit")
            .arg(launch.limit_bytes.to_string())
            .arg("--api-socket")
            .arg(&socket)
            .arg("--stats-json")
            .arg(&stats_path)
            .arg("--quiet")
            .stdin(Stdio::null())
            .stdout(create(&out_path)?)
            .stderr(create(&err_path)?);
        if let Some(rate) = launch.sampling {
            command.arg("--working-set-sampling").arg(rate.to_string());
        }
        let process = command.spawn().with_context(|| {
            format!(
                "cannot start {} for VM {name} ({})",
                launch.binary.display(),
                launch.config.display()
            )
        })?;
        Ok(ChildVm {
            name,
            config: launch.config.to_path_buf(),
            socket,
            stats_path,
            log_paths: (out_path, err_path),
            mem_bytes: launch.mem_bytes,
            floor_bytes: launch.floor_bytes,
            limit_bytes: launch.limit_bytes,
            balloon: launch.balloon,
            balloon_target_bytes: None,
            process,
            ended: None,
            previous: None,
            last: None,
        })
    }

    /// Whether it still runs; notes its exit status when it has ended.
    pub fn running(&mut self) -> bool {
        if self.ended.is_none() {
            if let Ok(Some(status)) = self.process.try_wait() {
                self.ended = Some(status);
            }
        }
        self.ended.is_none()
    }

    /// Reads its figures through `GET /stats`; None while its API is not
    /// up yet or no longer (starting, ending).
    pub fn read(&mut self) -> Option<Reading> {
        let reply = self.call("GET", "/stats", None).ok()?;
        let swap = &reply.body["swap"];
        let reading = Reading {
            limit_bytes: swap["mem_limit_bytes"].as_u64()?,
            resident_bytes: swap["resident_bytes"].as_u64().unwrap_or(0),
            estimate_bytes: swap["working_set"]["estimate_bytes"].as_u64(),
            // Without the waits for working-set samples: what the
            // supervisor's own sampling costs is no call for more memory.
            stall_us: serde_json::from_value::<swap::engine::StallStats>(swap["stall"].clone())
                .map_or(0, |stall| {
                    let sampling_us = swap["working_set"]["sample_wait_us"].as_u64().unwrap_or(0);
                    crate::auto_limit::refault_wait_us(&stall).saturating_sub(sampling_us)
                        / stall.vcpus.max(1)
                }),
            at: Some(Instant::now()),
        };
        self.limit_bytes = reading.limit_bytes;
        self.previous = self.last.replace(reading.clone());
        Some(reading)
    }

    /// Its stall over the last period, a share of its vCPUs' time (0
    /// before two readings).
    pub fn stall_share(&self) -> f64 {
        match (&self.previous, &self.last) {
            (
                Some(Reading {
                    at: Some(t0),
                    stall_us: s0,
                    ..
                }),
                Some(Reading {
                    at: Some(t1),
                    stall_us: s1,
                    ..
                }),
            ) => {
                let wall_us = t1.saturating_duration_since(*t0).as_micros().max(1) as f64;
                (s1.saturating_sub(*s0) as f64 / wall_us).min(1.0)
            }
            _ => 0.0,
        }
    }

    /// Sets its limit through `PUT /mem-limit`; the API's message on a
    /// refusal.
    pub fn set_limit(&self, limit_bytes: u64) -> Result<()> {
        let body = serde_json::json!({ "mem_limit_bytes": limit_bytes }).to_string();
        let reply = self.call("PUT", "/mem-limit", Some(body))?;
        if !(200..300).contains(&reply.status) {
            anyhow::bail!(
                "{}",
                reply.body["error"]["message"]
                    .as_str()
                    .unwrap_or("the API gave no message")
            );
        }
        Ok(())
    }

    /// Asks the guest, through its balloon, to give back what its RAM has
    /// above `limit_bytes` (`PUT /balloon`), so that the guest chooses
    /// what to free before the engine chooses what to evict; nothing when
    /// that target is already set or the VM has no steered balloon.
    pub fn set_balloon_for(&mut self, limit_bytes: u64) -> Result<()> {
        let target_bytes = self.mem_bytes.saturating_sub(limit_bytes);
        if !self.balloon || self.balloon_target_bytes == Some(target_bytes) {
            return Ok(());
        }
        let body = serde_json::json!({ "target_bytes": target_bytes }).to_string();
        let reply = self.call("PUT", "/balloon", Some(body))?;
        if !(200..300).contains(&reply.status) {
            anyhow::bail!(
                "{}",
                reply.body["error"]["message"]
                    .as_str()
                    .unwrap_or("the API gave no message")
            );
        }
        self.balloon_target_bytes = Some(target_bytes);
        Ok(())
    }

    /// Asks it to end as on SIGTERM: statistics written, socket removed.
    pub fn stop(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Ends it at once (SIGKILL), after a stop it did not heed.
    pub fn kill(&self) {
        self.signal(libc::SIGKILL);
    }

    fn signal(&self, signo: i32) {
        if self.ended.is_none() {
            // SAFETY: kill with the pid of a child this process has not
            // reaped (`ended` is None: only `running` and `wait` reap, and
            // both set it), so the pid is still ours.
            unsafe { libc::kill(self.process.id() as i32, signo) };
        }
    }

    /// Waits for it to end, noting its status.
    pub fn wait(&mut self) {
        if self.ended.is_none() {
            if let Ok(status) = self.process.wait() {
                self.ended = Some(status);
            }
        }
    }

    fn call(
        &self,
        method: &'static str,
        path: &'static str,
        body: Option<String>,
    ) -> Result<Reply> {
        call(
            &self.socket,
            CALL_TIMEOUT,
            &ApiRequest { method, path, body },
        )
    }
}
