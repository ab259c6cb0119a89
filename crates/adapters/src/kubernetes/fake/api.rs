//! The fake API server's HTTP side: discovery, the four resources, watches, port-forward.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::store::{Kind, Selector, StatusError};
use super::{Shared, kubelet, portforward};

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

fn status(e: &StatusError) -> Response {
    json_response(StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), &e.to_json())
}

fn bad_request(message: impl Into<String>) -> Response {
    status(&StatusError { code: 400, reason: "BadRequest", message: message.into() })
}

fn query(req: &Request) -> Vec<(String, String)> {
    req.uri()
        .query()
        .map(|q| {
            q.split('&')
                .filter_map(|pair| {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    Some((decode(k)?, decode(v)?))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Percent-decoding (and `+` as space) of one query component.
fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn param<'a>(q: &'a [(String, String)], name: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// What a request's path names.
#[derive(Debug)]
enum Target {
    Discovery(Value),
    Collection { kind: Kind, namespace: String },
    Object { kind: Kind, namespace: String, name: String },
    PortForward { namespace: String, name: String },
}

fn resource_list(group_version: &str, kinds: &[Kind]) -> Value {
    let resources: Vec<Value> = kinds
        .iter()
        .map(|k| {
            json!({
                "name": k.plural(),
                "singularName": k.kind().to_lowercase(),
                "namespaced": true,
                "kind": k.kind(),
                "verbs": ["create", "delete", "get", "list", "patch", "watch"],
                "shortNames": k.short_names(),
            })
        })
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}

fn target(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["version"] => Some(Target::Discovery(json!({
            "major": "1", "minor": "33", "emulationMajor": "1", "emulationMinor": "33",
            "minCompatibilityMajor": "1", "minCompatibilityMinor": "32",
            "gitVersion": "v1.33.0-sandlane-fake", "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
            "compiler": "gc", "platform": "linux/amd64",
        }))),
        ["api"] => Some(Target::Discovery(json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
        }))),
        ["apis"] => Some(Target::Discovery(json!({
            "kind": "APIGroupList", "apiVersion": "v1",
            "groups": [{
                "name": "networking.k8s.io",
                "versions": [{"groupVersion": "networking.k8s.io/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": "networking.k8s.io/v1", "version": "v1"},
            }],
        }))),
        ["api", "v1"] => {
            Some(Target::Discovery(resource_list("v1", &[Kind::Pod, Kind::Secret, Kind::Claim])))
        }
        ["apis", "networking.k8s.io", "v1"] => {
            Some(Target::Discovery(resource_list("networking.k8s.io/v1", &[Kind::NetworkPolicy])))
        }
        ["api", "v1", "namespaces", ns, plural] => {
            Some(Target::Collection { kind: Kind::from_plural("", plural)?, namespace: (*ns).to_owned() })
        }
        ["api", "v1", "namespaces", ns, "pods", name, "portforward"] => {
            Some(Target::PortForward { namespace: (*ns).to_owned(), name: (*name).to_owned() })
        }
        ["api", "v1", "namespaces", ns, plural, name] => Some(Target::Object {
            kind: Kind::from_plural("", plural)?,
            namespace: (*ns).to_owned(),
            name: (*name).to_owned(),
        }),
        ["apis", group, "v1", "namespaces", ns, plural] => {
            Some(Target::Collection { kind: Kind::from_plural(group, plural)?, namespace: (*ns).to_owned() })
        }
        ["apis", group, "v1", "namespaces", ns, plural, name] => Some(Target::Object {
            kind: Kind::from_plural(group, plural)?,
            namespace: (*ns).to_owned(),
            name: (*name).to_owned(),
        }),
        _ => None,
    }
}

/// Whether the client asked for metadata only (`list_metadata`).
fn wants_metadata(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"))
}

fn metadata_only(object: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": object["metadata"]})
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let started = Instant::now();
    let response = serve(&shared, req).await;
    shared.add_busy(|b| {
        b.requests += 1;
        b.handling += started.elapsed();
    });
    response
}

async fn serve(shared: &Arc<Shared>, req: Request) -> Response {
    let Some(target) = target(req.uri().path()) else {
        return status(&StatusError {
            code: 404,
            reason: "NotFound",
            message: format!("the server could not find the requested resource ({})", req.uri().path()),
        });
    };
    let q = query(&req);
    let method = req.method().clone();
    match (target, method) {
        (Target::Discovery(body), Method::GET) => json_response(StatusCode::OK, &body),
        (Target::Collection { kind, namespace }, Method::GET) => {
            let selector = match Selector::parse(param(&q, "labelSelector"), param(&q, "fieldSelector")) {
                Ok(s) => s,
                Err(e) => return bad_request(e),
            };
            if param(&q, "watch").is_some_and(|w| w == "true" || w == "1") {
                return watch(shared, kind, namespace, selector, &q);
            }
            let metadata = wants_metadata(req.headers());
            let store = shared.store();
            let items: Vec<Value> = store
                .list(kind, &namespace, &selector)
                .iter()
                .map(|o| if metadata { metadata_only(o) } else { o.clone() })
                .collect();
            let (api_version, list_kind) = if metadata {
                ("meta.k8s.io/v1".to_owned(), "PartialObjectMetadataList".to_owned())
            } else {
                (kind.api_version().to_owned(), format!("{}List", kind.kind()))
            };
            json_response(
                StatusCode::OK,
                &json!({
                    "apiVersion": api_version, "kind": list_kind,
                    "metadata": {"resourceVersion": store.version().to_string()},
                    "items": items,
                }),
            )
        }
        (Target::Collection { kind, namespace }, Method::POST) => {
            let body = match body_json(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            create(shared, kind, &namespace, body).await
        }
        (Target::Object { kind, namespace, name }, Method::GET) => {
            match shared.store().get(kind, &namespace, &name) {
                Some(o) => json_response(StatusCode::OK, o),
                None => status(&super::store::not_found(kind, &name)),
            }
        }
        (Target::Object { kind, namespace, name }, Method::PATCH) => {
            let content = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
            if !content.starts_with("application/merge-patch+json") {
                return status(&StatusError {
                    code: 415,
                    reason: "UnsupportedMediaType",
                    message: format!("the fake serves merge patches only, not {content:?}"),
                });
            }
            let patch = match body_json(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let result = shared.store().patch(kind, &namespace, &name, &patch);
            match result {
                Ok(o) => {
                    if kind == Kind::Secret {
                        shared.kubelet.secret_changed(shared, &namespace, &name);
                    }
                    json_response(StatusCode::OK, &o)
                }
                Err(e) => status(&e),
            }
        }
        (Target::Object { kind, namespace, name }, Method::DELETE) => {
            let grace = param(&q, "gracePeriodSeconds").and_then(|g| g.parse::<i64>().ok());
            delete(shared, kind, &namespace, &name, grace).await
        }
        (Target::PortForward { namespace, name }, Method::GET | Method::POST) => {
            portforward::upgrade(shared.clone(), namespace, name, &q, req).await
        }
        (_, method) => status(&StatusError {
            code: 405,
            reason: "MethodNotAllowed",
            message: format!("the fake does not serve {method} here"),
        }),
    }
}

async fn body_json(req: Request) -> Result<Value, Response> {
    let bytes: Bytes = axum::body::to_bytes(req.into_body(), 16 << 20)
        .await
        .map_err(|e| bad_request(format!("cannot read the body: {e}")))?;
    serde_json::from_slice(&bytes).map_err(|e| bad_request(format!("the body is not JSON: {e}")))
}

async fn create(shared: &Arc<Shared>, kind: Kind, namespace: &str, body: Value) -> Response {
    if body["kind"].as_str().is_some_and(|k| k != kind.kind()) {
        return bad_request(format!("a {} sent to {}", body["kind"], kind.plural()));
    }
    shared.received.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(body.clone());
    if kind == Kind::Pod
        && shared.take_fault(|f, i| {
            let hit = f.race_pod_creates > 0;
            if hit {
                f.race_pod_creates -= 1;
                i.raced_pod_creates += 1;
            }
            hit
        })
    {
        // Someone else (another replica) created the same pod a moment before.
        let raced = shared.store().create(kind, namespace, body.clone());
        if let Ok(created) = raced {
            kubelet::pod_created(shared, &created);
        }
    }
    let result = shared.store().create(kind, namespace, body);
    match result {
        Ok(created) => {
            if kind == Kind::Pod {
                kubelet::pod_created(shared, &created);
            }
            json_response(StatusCode::CREATED, &created)
        }
        Err(e) => status(&e),
    }
}

async fn delete(
    shared: &Arc<Shared>,
    kind: Kind,
    namespace: &str,
    name: &str,
    grace: Option<i64>,
) -> Response {
    if kind == Kind::Pod {
        let Some(pod) = shared.store().get(kind, namespace, name).cloned() else {
            return status(&super::store::not_found(kind, name));
        };
        let grace = grace.or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64()).unwrap_or(30);
        let marked = if pod["metadata"]["deletionTimestamp"].is_null() {
            let stamp = super::store::timestamp();
            let result = shared.store().update(kind, namespace, name, |o| {
                o["metadata"]["deletionTimestamp"] = Value::String(stamp);
                o["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            });
            match result {
                Ok(o) => o,
                Err(e) => return status(&e),
            }
        } else {
            pod
        };
        let (shared2, ns, n) = (shared.clone(), namespace.to_owned(), name.to_owned());
        tokio::spawn(async move { kubelet::delete_pod(&shared2, &ns, &n, grace).await });
        return json_response(StatusCode::OK, &marked);
    }
    let removed = shared.store().remove(kind, namespace, name);
    match removed {
        Ok(o) => {
            if kind == Kind::Claim {
                shared.kubelet.claim_removed(&o);
            }
            json_response(StatusCode::OK, &o)
        }
        Err(e) => status(&e),
    }
}

fn watch(
    shared: &Arc<Shared>,
    kind: Kind,
    namespace: String,
    selector: Selector,
    q: &[(String, String)],
) -> Response {
    if shared.take_fault(|f, i| {
        let hit = f.fail_watches > 0;
        if hit {
            f.fail_watches -= 1;
            i.failed_watches += 1;
        }
        hit
    }) {
        return status(&StatusError {
            code: 500,
            reason: "InternalError",
            message: "injected: watch refused".to_owned(),
        });
    }
    let from: Option<u64> = param(q, "resourceVersion").and_then(|v| v.parse().ok()).filter(|v| *v > 0);
    let timeout = param(q, "timeoutSeconds").and_then(|t| t.parse::<u64>().ok()).unwrap_or(290);
    let cut = shared.take_fault(|f, i| {
        let hit = f.cut_watches > 0;
        if hit {
            f.cut_watches -= 1;
            i.cut_watches += 1;
        }
        hit
    });
    let expired = from.is_some()
        && shared.take_fault(|f, i| {
            let hit = f.expire_watches > 0;
            if hit {
                f.expire_watches -= 1;
                i.expired_watches += 1;
            }
            hit
        });
    let (mut rx, backlog) = {
        let store = shared.store();
        let rx = store.subscribe();
        let backlog = match from {
            _ if expired => None,
            Some(v) => store.events_since(v),
            // No version: the current objects as ADDED, then changes.
            None => Some(
                store
                    .list(kind, &namespace, &selector)
                    .into_iter()
                    .map(|object| super::store::Event {
                        version: store.version(),
                        kind,
                        kind_of_change: "ADDED",
                        object,
                    })
                    .collect(),
            ),
        };
        (rx, backlog)
    };
    let (tx, body_rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let line = |change: &str, object: &Value| {
        Bytes::from(format!("{}\n", json!({"type": change, "object": object})))
    };
    tokio::spawn(async move {
        let Some(backlog) = backlog else {
            let gone =
                StatusError { code: 410, reason: "Expired", message: "too old resource version".to_owned() };
            let _ = tx.send(Ok(line("ERROR", &gone.to_json()))).await;
            return;
        };
        let mut last = from.unwrap_or(0);
        let matches = |e: &super::store::Event| {
            e.kind == kind
                && e.object["metadata"]["namespace"].as_str() == Some(namespace.as_str())
                && selector.matches(&e.object)
        };
        for e in backlog.iter().filter(|e| matches(e)) {
            last = last.max(e.version);
            if tx.send(Ok(line(e.kind_of_change, &e.object))).await.is_err() {
                return;
            }
            if cut {
                return;
            }
        }
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                () = &mut deadline => return,
                () = tx.closed() => return,
                event = rx.recv() => match event {
                    Ok(e) if e.version > last && matches(&e) => {
                        last = e.version;
                        if tx.send(Ok(line(e.kind_of_change, &e.object))).await.is_err() || cut {
                            return;
                        }
                    }
                    Ok(_) => {}
                    // Lagged or closed: end the watch; the client resumes from its version.
                    Err(_) => return,
                }
            }
        }
    });
    let stream =
        futures_util::stream::unfold(body_rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
