//! The HTTP API under a real, swapping VM, driven with the real `curl
//! --unix-socket` and with `hugevmm ctl`: every documented route answers
//! with a body its schema accepts, nothing undocumented is served, bad
//! requests get the status and a reason, several clients (and a silent
//! one) are served while the guest swaps, and the metrics pass the real
//! OpenMetrics parser and agree with `--stats-json`.

use integration_tests::openapi::Document;
use integration_tests::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(600);

/// A URL on the API socket (curl needs a host; the API ignores it).
fn url(path: &str) -> String {
    format!("http://localhost{path}")
}

/// Calls `method path` and checks the body against the document.
fn call_documented(
    doc: &Document,
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> CurlReply {
    let text = body.map(Value::to_string);
    let reply = curl(Some(socket), method, &url(path), text.as_deref(), &[]);
    let schema = doc
        .response_schema(method, path, reply.status, &reply.content_type)
        .unwrap_or_else(|e| panic!("{e}: {}", reply.body));
    let value = if reply.content_type.starts_with("application/json") {
        reply.json()
    } else {
        Value::String(reply.body.clone())
    };
    doc.validate(schema, &value)
        .unwrap_or_else(|e| panic!("{method} {path} -> {}: {e}\n{value}", reply.status));
    reply
}

/// An error reply: status, a schema-valid error object, and its message.
fn expect_error(doc: &Document, reply: &CurlReply, status: u16) -> String {
    assert_eq!(reply.status, status, "{}", reply.body);
    let value = reply.json();
    doc.validate(doc.error_schema(), &value)
        .unwrap_or_else(|e| panic!("{e}: {value}"));
    value["error"]["message"].as_str().unwrap().to_string()
}

/// A port nobody listens on, for --metrics-addr (bound and released: a
/// test of this machine's own loopback).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// What a raw client gets back: the status line and the body.
fn raw_exchange(socket: &Path, bytes: &[u8]) -> (String, String) {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    stream.write_all(bytes).unwrap();
    let mut text = Vec::new();
    let _ = stream.read_to_end(&mut text);
    let text = String::from_utf8_lossy(&text).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

/// A sample's value from the parsed metrics.
fn sample(metrics: &Value, family: &str, name: &str, labels: &Value) -> f64 {
    metrics[family]["samples"]
        .as_array()
        .unwrap_or_else(|| panic!("no metric family {family}: {metrics}"))
        .iter()
        .find(|s| s[0] == name && &s[1] == labels)
        .and_then(|s| s[2].as_f64())
        .unwrap_or_else(|| panic!("no sample {name}{labels} in {}", metrics[family]))
}

#[test]
fn the_api_matches_its_document_under_a_swapping_guest() {
    let test = "the_api_matches_its_document_under_a_swapping_guest";
    if skip_without_kvm_curl_and_parser(test) {
        return;
    }
    let doc = Document::load();
    let port = free_port();
    let metrics_url = format!("http://127.0.0.1:{port}/metrics");
    // The VM from a config file, one option overridden by a flag.
    let config = temp_file(
        "vm.json",
        &json!({
            "payload": "verify",
            "vcpus": 1,
            "mem": "256M",
            "mem-limit": "64M",
            "balloon": true,
            // Far more passes than the test waits for: quit ends it.
            "payload-args": "passes=100000",
            "metrics-addr": format!("127.0.0.1:{port}"),
        })
        .to_string(),
    );
    let (vm, socket) =
        start_with_api_socket(&["run", "--config", config.to_str().unwrap(), "--vcpus", "2"]);

    // Silent from the start, for the whole test.
    let silent = UnixStream::connect(&socket).unwrap();

    // Every documented operation answers as documented (quit last).
    let mut operations = doc.operations();
    operations.sort_by_key(|(method, path)| (path == "/actions", method.clone(), path.clone()));
    for (method, path) in &operations {
        let body = doc.example_body(method, path);
        let reply = call_documented(&doc, &socket, method, path, body.as_ref());
        assert_eq!(reply.status, 200, "{method} {path}: {}", reply.body);
    }
    let vm_info = call_documented(&doc, &socket, "GET", "/vm", None).json();
    assert_eq!(
        vm_info["config"]["vcpus"], 2,
        "the flag overrides the file: {vm_info}"
    );
    assert_eq!(vm_info["config"]["mem"], 256 << 20, "{vm_info}");
    assert_eq!(vm_info["config"]["payload"], "verify", "{vm_info}");
    // The examples lifted the limit to all of RAM: back to 64M.
    let body = json!({ "mem_limit_bytes": 64 << 20 });
    assert_eq!(
        call_documented(&doc, &socket, "PUT", "/mem-limit", Some(&body)).status,
        200
    );

    // Nothing undocumented: other methods are 405s naming the right
    // ones, other paths 404s.
    for (_, path) in &operations {
        let documented: Vec<&str> = operations
            .iter()
            .filter(|(_, p)| p == path)
            .map(|(m, _)| m.as_str())
            .collect();
        for method in ["GET", "PUT", "POST", "PATCH", "DELETE"] {
            if documented.contains(&method) {
                continue;
            }
            let reply = curl(Some(&socket), method, &url(path), None, &[]);
            let message = expect_error(&doc, &reply, 405);
            assert!(
                message.contains(documented[0]),
                "{method} {path}: {message}"
            );
        }
    }
    for path in ["/nope", "/vm/extra", "/metrics/", "/shutdown"] {
        let message = expect_error(
            &doc,
            &curl(Some(&socket), "GET", &url(path), None, &[]),
            404,
        );
        assert!(message.contains("GET /stats"), "{message}");
    }

    // Bad values: 400 with the reason.
    let bad = [
        ("/balloon", r#"{"target_bytes": 5000}"#, "multiple of 4 KiB"),
        (
            "/balloon",
            r#"{"target_bytes": 1099511627776}"#,
            "more than the guest's RAM",
        ),
        ("/balloon", r#"{"target": 4096}"#, "unknown field"),
        (
            "/mem-limit",
            r#"{"mem_limit_bytes": 1048576}"#,
            "mem_limit_bytes",
        ),
        ("/mem-limit", r#"{}"#, "missing field"),
        ("/actions", r#"{"action": "reboot"}"#, "pageout"),
        ("/actions", r#"{"action": "#, "bad body"),
    ];
    for (path, body, says) in bad {
        let reply = curl(Some(&socket), "PUT", &url(path), Some(body), &[]);
        let message = expect_error(&doc, &reply, 400);
        assert!(message.contains(says), "PUT {path} {body}: {message}");
    }
    // An oversized body: 413, before it is read.
    let huge = format!(r#"{{"target_bytes": 0, "pad": "{}"}}"#, "x".repeat(100_000));
    let message = expect_error(
        &doc,
        &curl(Some(&socket), "PUT", &url("/balloon"), Some(&huge), &[]),
        413,
    );
    assert!(message.contains("larger than"), "{message}");
    // A malformed request line: 400 with the reason, no crash.
    let (status, body) = raw_exchange(&socket, b"HELLO THERE\r\n\r\n");
    assert!(status.starts_with("HTTP/1.1 400"), "{status}");
    assert!(body.contains("malformed"), "{body}");
    let (status, _) = raw_exchange(&socket, b"\x00\xff\xfe garbage\r\n\r\n");
    assert!(status.starts_with("HTTP/1.1 400"), "{status}");
    // A metrics format nobody offers.
    let reply = curl(
        Some(&socket),
        "GET",
        &url("/metrics"),
        None,
        &["Accept: application/json"],
    );
    expect_error(&doc, &reply, 406);

    // Several clients at once, curl and ctl, while the guest swaps (and
    // the silent client still holds its connection).
    let before = ctl(&socket, &["stats"]);
    let clients: Vec<_> = (0..6)
        .map(|i| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                for _ in 0..5 {
                    if i % 2 == 0 {
                        let reply = curl(Some(&socket), "GET", &url("/stats"), None, &[]);
                        assert_eq!(reply.status, 200, "{}", reply.body);
                    } else {
                        assert!(ctl(&socket, &["balloon-stats"])["target_pages"].is_u64());
                    }
                }
            })
        })
        .collect();
    // A pageout among them, through ctl.
    let pageout = ctl(&socket, &["pageout"]);
    assert!(pageout["written_bytes"].is_u64(), "{pageout}");
    for client in clients {
        client.join().unwrap();
    }
    let after = ctl(&socket, &["stats"]);
    assert!(
        after["swap"]["faults"]["total"].as_u64() > before["swap"]["faults"]["total"].as_u64(),
        "the guest swapped meanwhile: {before} {after}"
    );
    // ctl's other words.
    assert_eq!(ctl(&socket, &["balloon", "4M"])["target_pages"], 1024);
    assert_eq!(
        ctl(&socket, &["mem-limit", "64M"])["mem_limit_bytes"],
        64 << 20
    );
    assert_eq!(
        ctl(&socket, &["help"])["commands"][0]["command"],
        "balloon SIZE"
    );
    let bad = hugevmm(
        &[
            "ctl",
            "--api-socket",
            socket.to_str().unwrap(),
            "mem-limit",
            "1M",
        ],
        LIMIT,
    );
    assert_eq!(bad.status, Some(1), "{}", bad.stderr);
    assert!(bad.stderr.contains("HTTP 400"), "{}", bad.stderr);

    // The silent client was dropped with a 408 (after 10 s), the others
    // served meanwhile.
    let mut silent_reply = String::new();
    silent
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let _ = (&silent).read_to_string(&mut silent_reply);
    assert!(silent_reply.starts_with("HTTP/1.1 408"), "{silent_reply}");

    // ctl --watch follows the VM until it ends.
    let watch = Background::start(&[
        "ctl",
        "--api-socket",
        socket.to_str().unwrap(),
        "--watch",
        "0.2",
        "stats",
    ]);

    // The metrics, over TCP (metrics only) and the socket, both through
    // the real parser; TCP serves nothing else.
    let tcp_vm = curl(
        None,
        "GET",
        &format!("http://127.0.0.1:{port}/vm"),
        None,
        &[],
    );
    assert_eq!(tcp_vm.status, 404, "{}", tcp_vm.body);
    let quit_body = r#"{"action": "quit"}"#;
    let tcp_quit = curl(
        None,
        "PUT",
        &format!("http://127.0.0.1:{port}/actions"),
        Some(quit_body),
        &[],
    );
    assert_eq!(tcp_quit.status, 404, "{}", tcp_quit.body);
    let text_format = curl(None, "GET", &metrics_url, None, &["Accept: text/plain"]);
    assert!(
        text_format
            .content_type
            .starts_with("text/plain; version=0.0.4"),
        "{}",
        text_format.content_type
    );
    let unix = curl(Some(&socket), "GET", &url("/metrics"), None, &[]);
    assert!(
        unix.content_type
            .starts_with("application/openmetrics-text"),
        "{}",
        unix.content_type
    );
    parse_openmetrics(&unix.body);
    let stats_before = ctl(&socket, &["stats"]);
    let scraped = curl(
        None,
        "GET",
        &metrics_url,
        None,
        &["Accept: application/openmetrics-text; version=1.0.0"],
    );
    assert_eq!(scraped.status, 200);
    let metrics = parse_openmetrics(&scraped.body);

    // quit, through the documented route.
    let reply = call_documented(
        &doc,
        &socket,
        "PUT",
        "/actions",
        Some(&json!({ "action": "quit" })),
    );
    assert_eq!(reply.json()["quitting"], true);
    let run = vm.finish(LIMIT);
    run.expect_status(0);
    assert!(!run.stdout.contains("MISMATCH"), "{}", run.stdout);
    assert!(!socket.exists(), "the socket is removed");
    let watched = watch.finish(LIMIT);
    watched.expect_status(0);
    assert!(
        watched.stdout.contains("resident_MiB"),
        "{}",
        watched.stdout
    );
    assert!(watched.stdout.lines().count() >= 2, "{}", watched.stdout);

    // The scrape lies between the stats read just before it and the
    // final --stats-json: every counter, by name, in that window.
    let stats = run.stats.as_ref().unwrap();
    let none = json!({});
    let window = |family: &str, name: &str, labels: &Value, pointer: &str| {
        let value = sample(&metrics, family, name, labels);
        let low = stats_before
            .pointer(pointer)
            .and_then(Value::as_f64)
            .unwrap();
        let high = stats.pointer(pointer).and_then(Value::as_f64).unwrap();
        assert!(
            low <= value && value <= high,
            "{name}{labels} = {value}, not within {pointer} {low}..={high}"
        );
    };
    for (family, pointer) in [
        ("hugevmm_swap_evictions", "/swap/evictions"),
        ("hugevmm_swap_clean_drops", "/swap/clean_drops"),
        ("hugevmm_swap_zero_chunks", "/swap/zero_chunks"),
        ("hugevmm_swap_evict_waits", "/swap/evict_waits"),
        ("hugevmm_swap_fault_messages", "/swap/faults/total"),
        ("hugevmm_swap_read_bytes", "/swap/bytes_read"),
        ("hugevmm_swap_written_bytes", "/swap/bytes_written"),
    ] {
        assert_eq!(metrics[family]["type"], "counter", "{family}");
        window(family, &format!("{family}_total"), &none, pointer);
    }
    for source in ["store", "staging", "zero"] {
        let labels = json!({ "source": source });
        window(
            "hugevmm_swap_faults",
            "hugevmm_swap_faults_total",
            &labels,
            &format!("/swap/faults/{source}"),
        );
    }
    window(
        "hugevmm_swap_faults",
        "hugevmm_swap_faults_total",
        &json!({ "source": "wp" }),
        "/swap/wp_faults",
    );
    window(
        "hugevmm_swap_restored_units",
        "hugevmm_swap_restored_units_total",
        &json!({ "mapping": "huge" }),
        "/swap/restored_huge",
    );
    for origin in ["absent", "stored", "staged", "resident"] {
        window(
            "hugevmm_swap_splits",
            "hugevmm_swap_splits_total",
            &json!({ "origin": origin }),
            &format!("/swap/split/splits_by_origin/{origin}"),
        );
    }
    window(
        "hugevmm_swap_collapses",
        "hugevmm_swap_collapses_total",
        &json!({ "outcome": "verified" }),
        "/swap/split/collapses_verified",
    );
    for (of, pointer) in [
        ("unit", "/swap/activations"),
        ("page", "/swap/split/page_activations"),
    ] {
        window(
            "hugevmm_swap_activations",
            "hugevmm_swap_activations_total",
            &json!({ "of": of }),
            pointer,
        );
    }
    window(
        "hugevmm_swap_page_evictions",
        "hugevmm_swap_page_evictions_total",
        &json!({ "result": "written" }),
        "/swap/split/pages_written",
    );
    for (family, kind, pointer) in [
        (
            "hugevmm_swap_store_retries",
            "transient",
            "/swap/store/retries",
        ),
        (
            "hugevmm_swap_store_retries",
            "checksum",
            "/swap/store/checksum_rereads",
        ),
        (
            "hugevmm_swap_store_recovered",
            "transient",
            "/swap/store/recovered",
        ),
        (
            "hugevmm_swap_store_fatal",
            "transient",
            "/swap/store/exhausted",
        ),
        (
            "hugevmm_swap_store_fatal",
            "checksum",
            "/swap/store/checksum_fatal",
        ),
        (
            "hugevmm_swap_store_retries",
            "authentication",
            "/swap/store/auth_rereads",
        ),
        (
            "hugevmm_swap_store_fatal",
            "authentication",
            "/swap/store/auth_fatal",
        ),
    ] {
        window(
            family,
            &format!("{family}_total"),
            &json!({ "kind": kind }),
            pointer,
        );
    }
    window(
        "hugevmm_swap_fault_latency_seconds",
        "hugevmm_swap_fault_latency_seconds_count",
        &none,
        "/swap/fault_latency_us/count",
    );
    // Figures that do not move agree exactly.
    for (family, pointer) in [
        ("hugevmm_guest_memory_bytes", "/mem_bytes"),
        ("hugevmm_vcpus", "/vcpus"),
        ("hugevmm_swap_unit_bytes", "/swap/unit_bytes"),
        ("hugevmm_swap_limit_bytes", "/swap/mem_limit_bytes"),
        ("hugevmm_balloon_target_bytes", "/balloon/target_bytes"),
    ] {
        assert_eq!(
            Some(sample(&metrics, family, family, &none)),
            stats.pointer(pointer).and_then(Value::as_f64),
            "{family} vs {pointer}"
        );
    }
    assert!(
        sample(
            &metrics,
            "hugevmm_swap_resident_bytes",
            "hugevmm_swap_resident_bytes",
            &none
        ) <= run.stat("/swap/resident_bytes_max") as f64
    );
    for size in ["4k", "2m", "1g"] {
        sample(
            &metrics,
            "hugevmm_kvm_stage2_pages",
            "hugevmm_kvm_stage2_pages",
            &json!({ "size": size }),
        );
    }
    // A real histogram: cumulative buckets ending in +Inf = _count.
    let latency = &metrics["hugevmm_swap_fault_latency_seconds"];
    assert_eq!(latency["type"], "histogram");
    let buckets: Vec<f64> = latency["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s[0] == "hugevmm_swap_fault_latency_seconds_bucket")
        .map(|s| s[2].as_f64().unwrap())
        .collect();
    assert!(buckets.len() > 10, "{latency}");
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{latency}");
    let count = sample(
        &metrics,
        "hugevmm_swap_fault_latency_seconds",
        "hugevmm_swap_fault_latency_seconds_count",
        &none,
    );
    assert_eq!(buckets.last(), Some(&count));
    assert!(
        count > 0.0 && buckets[0] < count,
        "faults of some latency: {latency}"
    );
    let service = &metrics["hugevmm_swap_fault_service_seconds"];
    assert_eq!(service["type"], "histogram", "{service}");
}

/// A config file that is not a VM description is refused before anything
/// starts, naming the key or value and saying what is accepted; no
/// /dev/kvm needed.
#[test]
fn bad_config_files_are_refused_by_name() {
    let run_with = |json: &str, extra: &[&str]| {
        let config = temp_file("bad-vm.json", json);
        let mut args = vec!["run", "--config", config.to_str().unwrap()];
        args.extend_from_slice(extra);
        hugevmm(&args, LIMIT)
    };
    let run = run_with(r#"{"payload": "hello", "memory": "1G"}"#, &[]);
    assert_eq!(run.status, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("unknown field `memory`") && run.stderr.contains("`mem`"),
        "{}",
        run.stderr
    );
    let run = run_with(r#"{"payload": "hello", "vcpus": 0}"#, &[]);
    assert_eq!(run.status, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("--vcpus 0 is out of range"),
        "{}",
        run.stderr
    );
    // The flag overrides the file's bad value, so the check passes on to
    // the next one: the missing guest.
    let run = run_with(r#"{"vcpus": 0}"#, &["--vcpus", "1"]);
    assert_eq!(run.status, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("nothing to run"), "{}", run.stderr);
    let run = run_with("mem = 1G", &[]);
    assert_eq!(run.status, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("is not a VM description"),
        "{}",
        run.stderr
    );
    let missing = temp_path("missing.json");
    let run = hugevmm(&["run", "--config", missing.to_str().unwrap()], LIMIT);
    assert_eq!(run.status, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("--config"), "{}", run.stderr);
}

/// `nobody`, the other user the peer tests run curl as.
const NOBODY: u32 = 65534;

/// Whether this test can run curl as `nobody` (root, setpriv, curl);
/// skips it if not.
fn can_curl_as_nobody(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 || !have_program("setpriv") {
        skip(
            test,
            Resource::OtherUser,
            "needs root and setpriv (util-linux) to run curl as nobody",
        );
        return false;
    }
    if !have_program("curl") {
        skip(
            test,
            Resource::Curl,
            "curl is not installed (apt-get install curl)",
        );
        return false;
    }
    true
}

/// `GET path` on the API socket with curl run as `nobody`: status, body.
fn curl_as_nobody(socket: &Path, path: &str) -> (u16, String) {
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args(["--reuid", &NOBODY.to_string()])
        .args(["--regid", &NOBODY.to_string(), "--clear-groups"])
        .args(["curl", "--silent", "--show-error", "--max-time", "120"])
        .arg("--unix-socket")
        .arg(socket)
        .args(["-w", "\n%{http_code}", &url(path)]);
    let output = run_with_limit(cmd, Duration::from_secs(180));
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "curl as nobody failed ({}): {}{text}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let (body, status) = text.rsplit_once('\n').expect("curl's -w line");
    (status.parse().unwrap(), body.to_string())
}

/// Arguments of a VM that runs until it is told to stop.
const LONG_RUN: [&str; 9] = [
    "run",
    "--payload",
    "verify",
    "--vcpus",
    "1",
    "--mem",
    "128M",
    "--payload-args",
    "passes=1000000",
];

#[test]
fn clients_of_another_uid_are_refused_unless_allowed() {
    let test = "clients_of_another_uid_are_refused_unless_allowed";
    if skip_without_kvm(test) || !can_curl_as_nobody(test) {
        return;
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let doc = Document::load();
    let (vm, socket) = start_with_api_socket(&LONG_RUN);
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600);
    // Let nobody reach the socket file: the uid check alone keeps it out.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (status, body) = curl_as_nobody(&socket, "/vm");
    let reply = CurlReply {
        status,
        content_type: "application/json".into(),
        body,
    };
    let message = expect_error(&doc, &reply, 403);
    assert!(
        message.contains(&format!("this client runs as uid {NOBODY}"))
            && message.contains(&format!("--api-allow-uid {NOBODY}")),
        "{message}"
    );
    // The owner (root here) is served as before.
    assert_eq!(
        curl(Some(&socket), "GET", &url("/vm"), None, &[]).status,
        200
    );
    vm.signal(libc::SIGTERM);
    let run = vm.finish(LIMIT);
    assert!(
        run.stderr.contains(&format!(
            "API: refused a client running as uid {NOBODY} (pid "
        )),
        "{}",
        run.stderr
    );

    // Allowed by name: served.
    let mut args = LONG_RUN.to_vec();
    let nobody = NOBODY.to_string();
    args.extend_from_slice(&["--api-allow-uid", &nobody]);
    let (vm, socket) = start_with_api_socket(&args);
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (status, body) = curl_as_nobody(&socket, "/vm");
    assert_eq!(status, 200, "{body}");
    let info: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(info["config"]["api-allow-uid"], json!([NOBODY]), "{info}");
    vm.signal(libc::SIGTERM);
    vm.finish(LIMIT).expect_status(128 + libc::SIGTERM);
}

/// One `GET /metrics` on `stream`: the status, once the whole response
/// is read (the connection stays open).
fn metrics_status(stream: &mut std::net::TcpStream) -> std::io::Result<u16> {
    stream.write_all(b"GET /metrics HTTP/1.1\r\n\r\n")?;
    let mut text = Vec::new();
    let mut byte = [0u8; 1];
    while !text.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        text.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&text).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body)?;
    Ok(head[9..12].parse().unwrap_or(0))
}

#[test]
fn one_peer_holds_at_most_four_metrics_connections_on_a_remote_address() {
    let test = "one_peer_holds_at_most_four_metrics_connections_on_a_remote_address";
    if skip_without_kvm(test) {
        return;
    }
    let port = free_port();
    let all_addresses = format!("0.0.0.0:{port}");
    let mut args = LONG_RUN.to_vec();
    args.extend_from_slice(&["--metrics-addr", &all_addresses]);
    let (vm, _socket) = start_with_api_socket(&args);
    let peer = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let connect = || {
        let stream = std::net::TcpStream::connect(peer).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        stream
    };
    // Four connections from this one peer, each just served; then a
    // fifth. A held one may have been dropped for idling meanwhile (10 s,
    // on a slow machine): then the round is tried again.
    let mut held = Vec::new();
    let mut rounds = 0;
    let refused = loop {
        held.retain_mut(|s| metrics_status(s).is_ok_and(|status| status == 200));
        while held.len() < 4 {
            let mut stream = connect();
            assert_eq!(metrics_status(&mut stream).unwrap(), 200);
            held.push(stream);
        }
        let mut extra = connect();
        let _ = extra.write_all(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
        let mut text = Vec::new();
        let _ = extra.read_to_end(&mut text);
        let text = String::from_utf8_lossy(&text).into_owned();
        if text.starts_with("HTTP/1.1 503") {
            break text;
        }
        let all_held = held
            .iter_mut()
            .all(|s| metrics_status(s).is_ok_and(|status| status == 200));
        assert!(
            !all_held,
            "a fifth connection from one peer was served while it held four: {text}"
        );
        rounds += 1;
        assert!(rounds < 20, "four connections never held at once");
    };
    assert!(
        refused.contains("too many connections from 127.0.0.1 (4, the most one peer may hold of the 16 client slots)"),
        "{refused}"
    );
    // The ones it holds are still served.
    for stream in &mut held {
        assert_eq!(metrics_status(stream).unwrap(), 200);
    }
    drop(held);
    vm.signal(libc::SIGTERM);
    vm.finish(LIMIT).expect_status(128 + libc::SIGTERM);
}
