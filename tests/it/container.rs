//! The lane end to end on the container driver: `SANDLANE_DRIVER=container` against the
//! throwaway podman service (`scripts/podman-throwaway.sh start`).

use serde_json::{Value, json};

use crate::support::{Backend, Env, Server};
use crate::token::verify_with_jwks;

/// The engine and image under test. Without them the test fails, unless the developer
/// skips `podman` by name (then `None`, said loudly; see `tests::services`).
fn engine() -> Option<(String, String)> {
    let engine = tests::services::podman_engine()?;
    Some((engine.docker_host, engine.image))
}

fn ensure(server: &Server, key: &str, session: &str, execution: &str) -> Value {
    let got = server.call(
        "PUT",
        &format!("/v1/orgs/acme/sessions/{session}/sandbox"),
        Some(key),
        Some(json!({"execution_id": execution})),
    );
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(got.1["outcome"], "ready", "{}", got.1);
    got.1["sandbox"].clone()
}

fn sh(server: &Server, key: &str, sandbox: &Value, script: &str) -> String {
    let id = sandbox["id"].as_str().unwrap();
    let got = server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{id}/exec"),
        Some(key),
        Some(json!({"argv": ["/bin/sh", "-c", script], "timeout_ms": 10_000})),
    );
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(got.1["exit_code"], 0, "{}", got.1);
    got.1["stdout"].as_str().unwrap().to_owned()
}

fn deprovision(server: &Server, key: &str, session: &str) {
    let got = server.call("DELETE", &format!("/v1/orgs/acme/sessions/{session}/sandbox"), Some(key), None);
    assert_eq!(got.0, 204, "{}", got.1);
}

#[test]
fn session_ensure_and_exec_on_containers() {
    let Some((host, image)) = engine() else { return };
    let mut env = Env::new(Backend::Sqlite).unwrap();
    env.set("SANDLANE_DRIVER", "container");
    env.set("SANDLANE_DOCKER_HOST", &host);
    env.set("SANDLANE_CONTAINER_IMAGE", &image);
    let user = env.add_caller("user-ada", "user", &["acme"]);
    let service = env.add_caller("svc-platform", "service", &["acme"]);
    let mut server = Server::start(&env);
    // Session ids of their own, so durable volumes of earlier runs are never met.
    let tag = env.data.path().file_name().unwrap().to_string_lossy().replace(['.', '_'], "-");
    let (s_user, s_service) = (format!("u{tag}"), format!("v{tag}"));

    let s = ensure(&server, &user, &s_user, "e1");
    assert_eq!((s["driver"].as_str(), s["durability"].as_str()), (Some("container"), Some("durable")));
    // The shell adds its own PWD and SHLVL.
    let vars = sh(&server, &user, &s, "env | grep -v -e '^PWD=' -e '^SHLVL=' | sort");
    let want = format!(
        "CURL_CA_BUNDLE=/run/sandlane/ca-bundle.pem\nGIT_SSL_CAINFO=/run/sandlane/ca-bundle.pem\n\
         HOME=/workspace\nHTTPS_PROXY=http://127.0.0.1:3128\nHTTP_PROXY=http://127.0.0.1:3128\n\
         NODE_EXTRA_CA_CERTS=/run/sandlane/ca.pem\nNODE_USE_ENV_PROXY=1\n\
         NO_PROXY=localhost,127.0.0.1,::1\nPATH=/usr/local/bin:/usr/bin:/bin\n\
         REQUESTS_CA_BUNDLE=/run/sandlane/ca-bundle.pem\nSANDLANE_CALLER_CLASS=user\n\
         SANDLANE_EXECUTION_ID=e1\nSANDLANE_ORG=acme\nSANDLANE_SANDBOX_ID={}\nSANDLANE_SESSION_ID={s_user}\n\
         SANDLANE_TOKEN_FILE=/run/sandlane/token\nSSL_CERT_FILE=/run/sandlane/ca-bundle.pem\n\
         http_proxy=http://127.0.0.1:3128\n\
         https_proxy=http://127.0.0.1:3128\nno_proxy=localhost,127.0.0.1,::1\n",
        s["id"].as_str().unwrap()
    );
    assert_eq!(vars, want, "exactly the contract's environment, nothing from the host");
    let token = sh(&server, &user, &s, "cat \"$SANDLANE_TOKEN_FILE\"");
    let jwks = server.call("GET", "/.well-known/jwks.json", None, None).1;
    let claims = verify_with_jwks(&token, &jwks);
    assert_eq!((claims["sub"].as_str(), claims["jti"].clone()), (Some("user-ada"), s["token_id"].clone()));
    assert_eq!(sh(&server, &user, &s, "pwd; echo kept > kept; ls"), "/workspace\nkept\n");

    // Deprovision, then the same key again: a new sandbox with the durable workspace.
    deprovision(&server, &user, &s_user);
    let again = ensure(&server, &user, &s_user, "e2");
    assert_ne!(again["id"], s["id"]);
    assert_eq!(sh(&server, &user, &again, "cat kept"), "kept\n");

    // A service caller's workspace is ephemeral.
    let e = ensure(&server, &service, &s_service, "e3");
    assert_eq!(e["durability"], "ephemeral");
    assert_eq!(sh(&server, &service, &e, "echo $SANDLANE_CALLER_CLASS"), "service\n");

    deprovision(&server, &user, &s_user);
    deprovision(&server, &service, &s_service);
    assert!(server.stop(), "clean shutdown; log:\n{}", server.log_text());
}
