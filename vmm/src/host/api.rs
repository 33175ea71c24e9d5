//! `hugevmm host --api-socket PATH`: the supervisor's own API, on the same
//! listener code as a VM's (mode 0600, peer checks, bounds): the VMs with
//! their limits, memory and stall (`GET /vms`), the budget (`GET /budget`,
//! `PUT /budget`, checked against the floors of the VMs that run), and
//! `GET /metrics`, every VM's figures under a `vm` label.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use serde_json::{json, Value};

use crate::control::api::{metrics_response, refuse_unrouted, route_index, Route, Service};
use crate::control::http::{Request, Response};
use crate::control::Routes;
use guestmem::size::{format_size, parse_size};

/// One VM as the API shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct VmView {
    /// Its name.
    pub name: String,
    /// Whether it still runs.
    pub running: bool,
    /// Its exit status, once it ended.
    pub exit_status: Option<i32>,
    /// Its guest RAM.
    pub mem_bytes: u64,
    /// The least limit it gets.
    pub floor_bytes: u64,
    /// Its limit.
    pub limit_bytes: u64,
    /// Its resident guest RAM at the last reading.
    pub resident_bytes: u64,
    /// Its working-set estimate, when it has one.
    pub estimate_bytes: Option<u64>,
    /// Its stall over the last period, a share of its vCPUs' time.
    pub stall_share: f64,
    /// Its API socket.
    pub socket: std::path::PathBuf,
}

/// What the supervisor's loop and the API share.
#[derive(Debug, Default)]
struct Shared {
    budget_bytes: u64,
    /// The floors of all the VMs, until the first [`HostState::set_vms`].
    planned_floors_bytes: u64,
    vms: Vec<VmView>,
}

/// The supervisor's state as its API serves it; the loop writes the VMs
/// once a period and reads the budget.
#[derive(Debug, Default)]
pub struct HostState {
    shared: Mutex<Shared>,
}

/// The routes: method, path, what it does.
pub const ROUTES: [Route; 5] = [
    ("GET", "/", "the routes"),
    (
        "GET",
        "/vms",
        "every VM: limit, resident memory, working-set estimate, stall, end",
    ),
    ("GET", "/budget", "the budget the VMs share"),
    (
        "PUT",
        "/budget",
        "change the budget: {\"budget_bytes\": N or \"SIZE\"}, at least the running VMs' floors",
    ),
    (
        "GET",
        "/metrics",
        "the VMs' figures, labelled by vm (OpenMetrics or Prometheus text)",
    ),
];

impl HostState {
    /// A state with `budget_bytes` and VMs to come whose floors sum to
    /// `floors_bytes`.
    pub fn new(budget_bytes: u64, floors_bytes: u64) -> HostState {
        HostState {
            shared: Mutex::new(Shared {
                budget_bytes,
                planned_floors_bytes: floors_bytes,
                vms: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The budget now.
    pub fn budget_bytes(&self) -> u64 {
        self.lock().budget_bytes
    }

    /// The VMs as of this period.
    pub fn set_vms(&self, vms: Vec<VmView>) {
        self.lock().vms = vms;
    }

    /// Sets the budget, refusing one below the floors of the VMs that run.
    pub fn set_budget(&self, budget_bytes: u64) -> Result<(), String> {
        let mut shared = self.lock();
        let floors: u64 = if shared.vms.is_empty() {
            shared.planned_floors_bytes
        } else {
            shared
                .vms
                .iter()
                .filter(|vm| vm.running)
                .map(|vm| vm.floor_bytes)
                .sum()
        };
        if budget_bytes < floors {
            return Err(format!(
                "a budget of {} is below the running VMs' floors together ({}): give at least that",
                format_size(budget_bytes),
                format_size(floors)
            ));
        }
        shared.budget_bytes = budget_bytes;
        Ok(())
    }

    fn vms_json(&self) -> Value {
        let shared = self.lock();
        json!({ "budget_bytes": shared.budget_bytes, "vms": shared.vms })
    }

    fn metrics(&self, accept: Option<&str>) -> Response {
        let shared = self.lock();
        let mut registry = Registry::with_prefix("hugevmm_host");
        let budget: Gauge = Gauge::default();
        budget.set(shared.budget_bytes as i64);
        registry.register_with_unit(
            "budget",
            "Memory the VMs may keep resident together",
            Unit::Bytes,
            budget,
        );
        let gauges = [
            ("vm_limit", "Each VM's limit on resident guest RAM"),
            ("vm_resident", "Each VM's resident guest RAM"),
            ("vm_working_set", "Each VM's working-set estimate"),
        ];
        for (index, (name, help)) in gauges.into_iter().enumerate() {
            let family = Family::<Vec<(String, String)>, Gauge>::default();
            for vm in shared.vms.iter().filter(|vm| vm.running) {
                let value = match index {
                    0 => Some(vm.limit_bytes),
                    1 => Some(vm.resident_bytes),
                    _ => vm.estimate_bytes,
                };
                if let Some(value) = value {
                    family
                        .get_or_create(&vec![("vm".to_string(), vm.name.clone())])
                        .set(value as i64);
                }
            }
            registry.register_with_unit(name, help, Unit::Bytes, family);
        }
        let stall = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
        let running = Family::<Vec<(String, String)>, Gauge>::default();
        for vm in &shared.vms {
            let label = vec![("vm".to_string(), vm.name.clone())];
            running.get_or_create(&label).set(i64::from(vm.running));
            if vm.running {
                stall.get_or_create(&label).set(vm.stall_share);
            }
        }
        registry.register(
            "vm_stall_ratio",
            "Each VM's waits on refaults over the last period, a share of its vCPUs' time",
            stall,
        );
        registry.register(
            "vm_running",
            "1 while the VM runs, 0 once it ended",
            running,
        );
        metrics_response(crate::control::metrics::encode(&registry, accept))
    }
}

/// The budget a `PUT /budget` body names: a number of bytes or a size.
fn budget_of(body: &[u8]) -> Result<u64, String> {
    let hint = "send {\"budget_bytes\": N} or {\"budget_bytes\": \"SIZE\"}, e.g. \"1G\"";
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON ({e}): {hint}"))?;
    match &value["budget_bytes"] {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| format!("budget_bytes {n}: {hint}")),
        Value::String(s) => parse_size(s).map_err(|e| format!("budget_bytes {s:?}: {e}; {hint}")),
        _ => Err(format!("no budget_bytes in the body: {hint}")),
    }
}

impl Routes for HostState {
    fn respond(&self, _service: Service, request: &Request) -> Response {
        let routes: Vec<&Route> = ROUTES.iter().collect();
        if let Some(refusal) = refuse_unrouted(&routes, request) {
            return refusal;
        }
        let (method, path) = (request.method.as_str(), request.path.as_str());
        match (method, path) {
            ("GET", "/vms") => Response::json(200, &self.vms_json()),
            ("GET", "/budget") => {
                Response::json(200, &json!({ "budget_bytes": self.budget_bytes() }))
            }
            ("PUT", "/budget") => match budget_of(&request.body).and_then(|b| {
                self.set_budget(b)?;
                Ok(b)
            }) {
                Ok(budget_bytes) => Response::json(200, &json!({ "budget_bytes": budget_bytes })),
                Err(message) => Response::error(400, message),
            },
            ("GET", "/metrics") => self.metrics(request.accept.as_deref()),
            _ => Response::json(200, &route_index(&routes)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, path: &str, body: &str) -> Request {
        Request {
            method: method.into(),
            path: path.into(),
            accept: None,
            content_type: Some("application/json".into()),
            body: body.as_bytes().to_vec(),
            close: true,
        }
    }

    fn vm(name: &str, running: bool) -> VmView {
        VmView {
            name: name.into(),
            running,
            exit_status: (!running).then_some(0),
            mem_bytes: 512 << 20,
            floor_bytes: 64 << 20,
            limit_bytes: 128 << 20,
            resident_bytes: 100 << 20,
            estimate_bytes: Some(80 << 20),
            stall_share: 0.25,
            socket: "/tmp/x.sock".into(),
        }
    }

    #[test]
    fn the_budget_changes_only_above_the_running_vms_floors() {
        let state = HostState::new(256 << 20, 0);
        state.set_vms(vec![vm("a", true), vm("b", true), vm("c", false)]);
        let put = |body: &str| state.respond(Service::Api, &request("PUT", "/budget", body));
        let refused = put(r#"{"budget_bytes": "100M"}"#);
        assert_eq!(refused.status, 400);
        assert!(String::from_utf8_lossy(&refused.body).contains("below the running VMs' floors"));
        assert_eq!(put(r#"{"budget_bytes": "128M"}"#).status, 200);
        assert_eq!(state.budget_bytes(), 128 << 20);
        assert_eq!(put(r#"{"budget_bytes": 536870912}"#).status, 200);
        assert_eq!(state.budget_bytes(), 512 << 20);
        for bad in [
            "{}",
            "[]",
            r#"{"budget_bytes": "lots"}"#,
            r#"{"budget_bytes": -1}"#,
        ] {
            let response = put(bad);
            assert_eq!(response.status, 400, "{bad}");
            assert!(
                String::from_utf8_lossy(&response.body).contains("budget_bytes"),
                "{bad}"
            );
        }
    }

    #[test]
    fn before_the_vms_report_the_planned_floors_bound_the_budget() {
        let state = HostState::new(256 << 20, 128 << 20);
        assert!(state.set_budget(100 << 20).is_err());
        assert!(state.set_budget(128 << 20).is_ok());
    }

    #[test]
    fn metrics_carry_a_vm_label() {
        let state = HostState::new(256 << 20, 0);
        state.set_vms(vec![vm("a", true), vm("b", false)]);
        let response = state.respond(Service::Api, &request("GET", "/metrics", ""));
        assert_eq!(response.status, 200);
        let text = String::from_utf8(response.body).unwrap();
        assert!(
            text.contains("hugevmm_host_budget_bytes 268435456"),
            "{text}"
        );
        assert!(
            text.contains("hugevmm_host_vm_limit_bytes{vm=\"a\"} 134217728"),
            "{text}"
        );
        assert!(
            text.contains("hugevmm_host_vm_stall_ratio{vm=\"a\"} 0.25"),
            "{text}"
        );
        assert!(
            text.contains("hugevmm_host_vm_running{vm=\"b\"} 0"),
            "{text}"
        );
        assert!(
            !text.contains("hugevmm_host_vm_limit_bytes{vm=\"b\"}"),
            "{text}"
        );
    }

    #[test]
    fn unknown_routes_and_methods_say_what_there_is() {
        let state = HostState::new(1, 0);
        let r = state.respond(Service::Api, &request("GET", "/nope", ""));
        assert_eq!(r.status, 404);
        assert!(String::from_utf8_lossy(&r.body).contains("PUT /budget"));
        let r = state.respond(Service::Api, &request("DELETE", "/vms", ""));
        assert_eq!((r.status, r.allow.as_deref()), (405, Some("GET")));
    }
}
