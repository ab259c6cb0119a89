//! The contract pages in `docs/` held to the code they describe: the routes, answers and
//! error codes of `api.md` against the OpenAPI document and `Code`, every setting of
//! `configuration.md` against `Settings`, the variables of `sandbox.md` against the
//! driver environment, the tools of `mcp.md` against the MCP server's. (`cli.md` is
//! checked against the CLI in the binary's tests.)

use std::collections::{BTreeMap, BTreeSet};

use domain::{
    AgentExecution, CallerClass, CallerIdentity, ExecutionId, IdentityId, OrgId, Phase, SandboxId, SessionId,
};
use serde_json::Value;

use crate::config::{Settings, env_var};
use crate::http::error::Code;

const API: &str = include_str!("../../../docs/api.md");
const CONFIGURATION: &str = include_str!("../../../docs/configuration.md");
const SANDBOX: &str = include_str!("../../../docs/sandbox.md");
const MCP: &str = include_str!("../../../docs/mcp.md");

/// The cells of every table row of `page` whose first cell starts with a backtick.
fn rows(page: &str) -> Vec<Vec<String>> {
    page.lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| l.trim().trim_matches('|').split(" | ").map(|c| c.trim().to_owned()).collect())
        .collect()
}

fn unquote(cell: &str) -> &str {
    cell.trim_matches('`')
}

#[test]
fn every_route_in_api_md_is_in_the_openapi_document_and_back() {
    let doc: Value = serde_json::from_str(crate::http::openapi::document()).unwrap();
    let mut served = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let statuses: BTreeSet<String> = op["responses"].as_object().unwrap().keys().cloned().collect();
            let secured = op["security"].as_array().is_some_and(|s| !s.is_empty());
            served.insert((method.to_uppercase(), path.clone()), (statuses, secured));
        }
    }
    let mut documented = BTreeMap::new();
    for row in rows(API).into_iter().filter(|r| r.len() == 4 && r[1].starts_with("`/")) {
        let statuses: BTreeSet<String> = row[3].split(", ").map(str::to_owned).collect();
        let secured = row[2] != "anyone";
        documented.insert((unquote(&row[0]).to_owned(), unquote(&row[1]).to_owned()), (statuses, secured));
    }
    assert_eq!(documented.len(), 45, "api.md's route table: {documented:?}");
    let only_served: Vec<_> = served.keys().filter(|k| !documented.contains_key(*k)).collect();
    let only_documented: Vec<_> = documented.keys().filter(|k| !served.contains_key(*k)).collect();
    assert!(only_served.is_empty(), "served but not in docs/api.md: {only_served:?}");
    assert!(only_documented.is_empty(), "in docs/api.md but not served: {only_documented:?}");
    for (route, (statuses, secured)) in &served {
        assert_eq!(&documented[route].0, statuses, "answers of {route:?}");
        assert_eq!(documented[route].1, *secured, "who may call {route:?}");
    }
}

#[test]
fn every_error_code_in_api_md_is_the_servers() {
    let documented: BTreeMap<String, (String, String)> = rows(API)
        .into_iter()
        .filter(|r| r.len() == 3 && r[1].parse::<u16>().is_ok())
        .map(|r| (unquote(&r[0]).to_owned(), (r[1].clone(), r[2].clone())))
        .collect();
    for code in Code::ALL {
        let name = serde_json::to_value(code).unwrap().as_str().unwrap().to_owned();
        let (status, _) = documented.get(&name).unwrap_or_else(|| panic!("{name} is not in docs/api.md"));
        assert_eq!(status, &code.status().as_u16().to_string(), "{name}");
    }
    for (name, (_, when)) in &documented {
        let known = Code::ALL.iter().any(|c| serde_json::to_value(c).unwrap() == name.as_str());
        assert!(
            known || when.starts_with("a quota") && when.contains("reserved"),
            "{name} is documented, not served"
        );
    }
}

#[test]
fn configuration_md_documents_every_setting() {
    let defaults = Settings::default().flattened();
    let documented: BTreeMap<String, (String, String)> = rows(CONFIGURATION)
        .into_iter()
        .filter(|r| r.len() == 4)
        .map(|r| (unquote(&r[0]).to_owned(), (unquote(&r[1]).to_owned(), r[2].clone())))
        .collect();
    let keys: BTreeSet<&String> = defaults.keys().collect();
    let doc_keys: BTreeSet<&String> = documented.keys().collect();
    assert_eq!(doc_keys, keys, "docs/configuration.md's table against Settings");
    for (key, value) in &defaults {
        let (variable, default) = &documented[key];
        assert_eq!(variable, &env_var(key), "{key}");
        let want = if value.is_null() { "unset".to_owned() } else { format!("`{value}`") };
        assert_eq!(default, &want, "the default of {key}");
    }
}

#[test]
fn sandbox_md_lists_exactly_the_environment() {
    let execution = AgentExecution {
        org: OrgId::parse("acme").unwrap(),
        session_id: SessionId::parse("s1").unwrap(),
        execution_id: ExecutionId::parse("e1").unwrap(),
        phase: Phase::Pending,
    };
    let caller = CallerIdentity::from_wire(
        IdentityId::parse("u1").unwrap(),
        CallerClass::User,
        vec![execution.org.clone()],
        None,
    )
    .unwrap()
    .sandbox_caller();
    let (_, environment) = domain::split_caller(&execution, &caller, &SandboxId::generate(1, 1));
    let set: BTreeMap<String, String> =
        environment.vars().into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    let documented: BTreeMap<String, String> = rows(SANDBOX)
        .into_iter()
        .filter(|r| r.len() == 2)
        .map(|r| (unquote(&r[0]).to_owned(), r[1].clone()))
        .collect();
    assert_eq!(documented.keys().collect::<Vec<_>>(), set.keys().collect::<Vec<_>>());
    for name in ["SANDLANE_TOKEN_FILE", "HOME", "PATH"] {
        assert!(documented[name].contains(&format!("`{}`", set[name])), "{name}: {}", documented[name]);
    }
}

#[test]
fn mcp_md_documents_exactly_the_tools() {
    let documented: BTreeSet<String> = rows(MCP).iter().map(|r| unquote(&r[0]).to_owned()).collect();
    let served: BTreeSet<String> = crate::mcp::tools::LaneTools::names().into_iter().collect();
    assert_eq!(documented, served, "docs/mcp.md's tools table against the MCP server's tools");
}
