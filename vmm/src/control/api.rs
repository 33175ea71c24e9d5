//! The API's routes: which method and path does what, the request bodies
//! and their checks. `docs/api.yaml` documents the same table; a test
//! below holds the two together.

use super::context::{ControlContext, Outcome, Refusal};
use super::http::{shorten, Request, Response, JSON};
use super::metrics;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// What a listener serves: the whole API (the Unix socket), or only the
/// metrics (`--metrics-addr`, reachable over the network, so it must never
/// change the VM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// Every route.
    Api,
    /// `GET /metrics` only.
    MetricsOnly,
}

/// Every route: method, path, what it does.
pub const ROUTES: [(&str, &str, &str); 8] = [
    ("GET", "/vm", "state, uptime and the configuration as given"),
    ("GET", "/stats", "the run's figures so far (the --stats-json fields known while it runs)"),
    ("GET", "/metrics", "the figures as Prometheus metrics (OpenMetrics, or Prometheus text 0.0.4 if Accept asks for it)"),
    ("GET", "/balloon", "the balloon's figures; asks the guest for fresh statistics"),
    ("PUT", "/balloon", "set the balloon target: {\"target_bytes\": N}"),
    ("PUT", "/mem-limit", "change the cap on resident guest RAM: {\"mem_limit_bytes\": N} or null to lift it"),
    ("PUT", "/actions", "{\"action\": \"pageout\"} evicts all guest RAM now; {\"action\": \"quit\"} ends the VM"),
    // Listed so that the table is the one place routes are named; the
    // router answers it like the others.
    ("GET", "/", "this list of routes"),
];

fn routes_of(service: Service) -> impl Iterator<Item = &'static Route> {
    ROUTES
        .iter()
        .filter(move |(_, path, _)| service == Service::Api || *path == "/metrics")
}

/// `PUT /balloon`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BalloonBody {
    target_bytes: u64,
}

/// `PUT /mem-limit`. The field must be there, null or a number: a body
/// that forgot it must not lift the limit.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemLimitBody {
    #[serde(deserialize_with = "present_or_null")]
    mem_limit_bytes: Option<u64>,
}

fn present_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Option::<u64>::deserialize(d)
}

/// `PUT /actions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, tag = "action", rename_all = "lowercase")]
enum Action {
    Pageout,
    Quit,
}

/// The body of `request` as `T`, or a 400/415 that shows a good body.
fn body<T: DeserializeOwned>(request: &Request, example: &str) -> Result<T, Refusal> {
    if let Some(ct) = &request.content_type {
        let media = ct.split(';').next().unwrap_or_default().trim();
        // curl -d labels its body a form unless told otherwise; the body
        // is read as JSON either way, so the label is let pass rather than
        // failing the README's one-liners.
        let accepted = [JSON, "application/x-www-form-urlencoded"];
        if !accepted.iter().any(|a| media.eq_ignore_ascii_case(a)) {
            return Err(Refusal {
                status: 415,
                message: format!(
                    "{} {} takes a JSON body, not {}: send Content-Type: application/json (or none), e.g. {example}",
                    request.method,
                    request.path,
                    shorten(ct)
                ),
            });
        }
    }
    if request.body.iter().all(u8::is_ascii_whitespace) {
        return Err(Refusal::bad_value(format!(
            "{} {} needs a JSON body, e.g. {example}",
            request.method, request.path
        )));
    }
    serde_json::from_slice(&request.body).map_err(|e| {
        Refusal::bad_value(format!(
            "bad body for {} {}: {}; send e.g. {example}",
            request.method,
            request.path,
            shorten(&e.to_string())
        ))
    })
}

fn respond(outcome: Outcome) -> Response {
    match outcome {
        Ok(value) => Response::json(200, &value),
        Err(refusal) => Response::error(refusal.status, refusal.message),
    }
}

/// A route: method, path, what it does.
pub type Route = (&'static str, &'static str, &'static str);

/// The 404 (no route has the path) or 405 (none with the method; `Allow`
/// names those that have it) for a request none of `routes` takes, each
/// listing the routes; None when one takes it.
pub fn refuse_unrouted(routes: &[&Route], request: &Request) -> Option<Response> {
    let (method, path) = (request.method.as_str(), request.path.as_str());
    let list = routes
        .iter()
        .map(|(m, p, _)| format!("{m} {p}"))
        .collect::<Vec<_>>()
        .join(", ");
    let known: Vec<&str> = routes
        .iter()
        .filter(|(_, p, _)| *p == path)
        .map(|(m, _, _)| *m)
        .collect();
    if known.is_empty() {
        return Some(Response::error(
            404,
            format!("no such path {}; the routes are {list}", shorten(path)),
        ));
    }
    if known.contains(&method) {
        return None;
    }
    let allow = known.join(", ");
    let mut response = Response::error(
        405,
        format!(
            "{} is not allowed on {path}: use {allow} (the routes are {list})",
            shorten(method)
        ),
    );
    response.allow = Some(allow);
    Some(response)
}

/// `GET /`'s body: the routes.
pub fn route_index(routes: &[&Route]) -> serde_json::Value {
    serde_json::json!({
        "routes": routes
            .iter()
            .map(|(m, p, does)| serde_json::json!({ "method": m, "path": p, "does": does }))
            .collect::<Vec<_>>(),
    })
}

/// `GET /metrics`' response from the encoded text, or its refusal.
pub fn metrics_response(rendered: Result<(&'static str, String), Refusal>) -> Response {
    match rendered {
        Ok((content_type, text)) => Response {
            status: 200,
            content_type: content_type.into(),
            body: text.into_bytes(),
            allow: None,
        },
        Err(refusal) => Response::error(refusal.status, refusal.message),
    }
}

/// The response to `request`.
pub fn handle(context: &ControlContext, service: Service, request: &Request) -> Response {
    let routes: Vec<&Route> = routes_of(service).collect();
    if let Some(refusal) = refuse_unrouted(&routes, request) {
        return refusal;
    }
    let (method, path) = (request.method.as_str(), request.path.as_str());
    match (method, path) {
        ("GET", "/metrics") => metrics_response(metrics::render(
            &context.snapshot(),
            request.accept.as_deref(),
        )),
        ("GET", "/") => Response::json(200, &route_index(&routes)),
        ("GET", "/vm") => Response::json(200, &context.vm_info()),
        ("GET", "/stats") => Response::json(200, &context.stats()),
        ("GET", "/balloon") => respond(context.balloon()),
        ("PUT", "/balloon") => respond(
            body::<BalloonBody>(request, r#"{"target_bytes": 268435456}"#)
                .and_then(|b| context.set_balloon(b.target_bytes)),
        ),
        ("PUT", "/mem-limit") => respond(
            body::<MemLimitBody>(
                request,
                r#"{"mem_limit_bytes": 268435456} or {"mem_limit_bytes": null}"#,
            )
            .and_then(|b| context.set_mem_limit(b.mem_limit_bytes)),
        ),
        ("PUT", "/actions") => respond(
            body::<Action>(request, r#"{"action": "pageout"} or {"action": "quit"}"#).and_then(
                |action| match action {
                    Action::Pageout => context.pageout(),
                    Action::Quit => context.quit(),
                },
            ),
        ),
        _ => unreachable!("every route in ROUTES has an arm: {method} {path}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::context::tests::context;
    use serde_json::Value;

    fn request(method: &str, path: &str, body: &str) -> Request {
        Request {
            method: method.into(),
            path: path.into(),
            accept: None,
            content_type: None,
            body: body.as_bytes().to_vec(),
            close: false,
        }
    }

    fn call(ctx: &ControlContext, method: &str, path: &str, body: &str) -> (u16, Value) {
        let r = handle(ctx, Service::Api, &request(method, path, body));
        let value = if r.content_type == JSON {
            serde_json::from_slice(&r.body).unwrap()
        } else {
            Value::String(String::from_utf8(r.body).unwrap())
        };
        (r.status, value)
    }

    fn message(value: &Value) -> &str {
        value["error"]["message"].as_str().unwrap()
    }

    #[test]
    fn every_route_answers() {
        let ctx = context(true);
        for (method, path, _) in ROUTES {
            let body = match path {
                "/balloon" => r#"{"target_bytes": 4194304}"#,
                "/mem-limit" => r#"{"mem_limit_bytes": null}"#,
                "/actions" => r#"{"action": "quit"}"#,
                _ => "",
            };
            let (status, value) = call(&ctx, method, path, body);
            // No engine and no run loop in this context: those are 409s,
            // but never a 404 or 405 for a route of the table.
            assert!(
                matches!(status, 200 | 409),
                "{method} {path}: {status} {value}"
            );
        }
        let (status, value) = call(&ctx, "GET", "/", "");
        assert_eq!(status, 200);
        assert_eq!(value["routes"].as_array().unwrap().len(), ROUTES.len());
    }

    #[test]
    fn bad_requests_get_the_right_status_and_a_reason() {
        let ctx = context(true);
        let (status, value) = call(&ctx, "GET", "/nope", "");
        assert_eq!(status, 404);
        assert!(message(&value).contains("GET /vm"), "{value}");
        let r = handle(&ctx, Service::Api, &request("DELETE", "/balloon", ""));
        assert_eq!(r.status, 405);
        assert_eq!(r.allow.as_deref(), Some("GET, PUT"));
        for (body, says) in [
            ("", "needs a JSON body"),
            ("{", "bad body"),
            (r#"{"target_bytes": "256M"}"#, "invalid type"),
            (r#"{"target_bytes": -1}"#, "invalid value"),
            (r#"{"target": 1}"#, "unknown field"),
            (r#"{"target_bytes": 5000}"#, "multiple of 4 KiB"),
        ] {
            let (status, value) = call(&ctx, "PUT", "/balloon", body);
            assert_eq!(status, 400, "{body}: {value}");
            assert!(message(&value).contains(says), "{body}: {value}");
        }
        let (status, value) = call(&ctx, "PUT", "/mem-limit", "{}");
        assert_eq!(status, 400, "{value}");
        assert!(message(&value).contains("missing field"), "{value}");
        let (status, value) = call(&ctx, "PUT", "/actions", r#"{"action": "reboot"}"#);
        assert_eq!(status, 400, "{value}");
        assert!(message(&value).contains("pageout"), "{value}");
        let mut text = request("PUT", "/balloon", "target_bytes=0");
        text.content_type = Some("text/plain".into());
        assert_eq!(handle(&ctx, Service::Api, &text).status, 415);
        // curl -d's label, with a JSON body, is read as JSON.
        let mut form = request("PUT", "/balloon", r#"{"target_bytes": 0}"#);
        form.content_type = Some("application/x-www-form-urlencoded".into());
        assert_eq!(handle(&ctx, Service::Api, &form).status, 200);
    }

    #[test]
    fn the_metrics_listener_serves_metrics_only() {
        let ctx = context(true);
        let r = handle(&ctx, Service::MetricsOnly, &request("GET", "/metrics", ""));
        assert_eq!(r.status, 200);
        for (method, path, _) in ROUTES.iter().filter(|(_, p, _)| *p != "/metrics") {
            let r = handle(&ctx, Service::MetricsOnly, &request(method, path, ""));
            assert_eq!(r.status, 404, "{method} {path}");
        }
        assert_eq!(ctx.balloon().unwrap()["target_pages"], 0, "nothing changed");
    }

    /// docs/api.yaml lists exactly the routes the router serves.
    #[test]
    fn the_openapi_document_lists_every_route_and_no_other() {
        let doc: Value = serde_yaml_ng::from_str(include_str!("../../../docs/api.yaml")).unwrap();
        let mut documented: Vec<(String, String)> = Vec::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in item.as_object().unwrap().keys() {
                documented.push((method.to_ascii_uppercase(), path.clone()));
            }
        }
        documented.sort();
        let mut served: Vec<(String, String)> = ROUTES
            .iter()
            .map(|(m, p, _)| (m.to_string(), p.to_string()))
            .collect();
        served.sort();
        assert_eq!(documented, served, "docs/api.yaml and ROUTES differ");
    }
}
