use proptest::prelude::*;

use super::*;
use crate::caller::{CallerClass, CallerIdentity};
use crate::execution::{AgentExecution, Phase, WorkflowExecution};

fn id() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._:@-]{1,40}"
}

fn class() -> impl Strategy<Value = CallerClass> {
    prop_oneof![Just(CallerClass::User), Just(CallerClass::Service), Just(CallerClass::Internal)]
}

fn caller(identity: &str, class: CallerClass) -> SandboxCaller {
    if class == CallerClass::Internal {
        CallerIdentity::internal().sandbox_caller()
    } else {
        CallerIdentity::from_wire(IdentityId::parse(identity).unwrap(), class, vec![], None)
            .unwrap()
            .sandbox_caller()
    }
}

/// The split of `caller` for a workflow execution (`workflow`) or an agent execution of
/// `session`.
fn split_for(
    caller: &SandboxCaller,
    workflow: bool,
    org: &str,
    session: &str,
    exec: &str,
    sandbox: &SandboxId,
) -> (MintRequest, DriverEnvironment) {
    let org = OrgId::parse(org).unwrap();
    let execution_id = ExecutionId::parse(exec).unwrap();
    if workflow {
        split_caller(&WorkflowExecution { org, execution_id, phase: Phase::Pending }, caller, sandbox)
    } else {
        let session_id = SessionId::parse(session).unwrap();
        split_caller(
            &AgentExecution { org, session_id, execution_id, phase: Phase::Pending },
            caller,
            sandbox,
        )
    }
}

proptest! {
    #[test]
    fn mint_sees_the_id_and_not_the_class_env_sees_the_class_and_not_the_id(
        identity in id(), class in class(), org in id(), session in id(), exec in id(),
        workflow: bool, t in 0u64..(1 << 48), r: u128,
    ) {
        let caller = caller(&identity, class);
        let sandbox = SandboxId::generate(t, r);
        let (mint, env) = split_for(&caller, workflow, &org, &session, &exec, &sandbox);

        // The mint holds the id and the sandbox facts...
        prop_assert_eq!(mint.subject(), caller.identity_id());
        prop_assert_eq!(mint.session_claim(), if workflow { "" } else { session.as_str() });
        prop_assert_eq!(mint.execution_id().as_str(), exec.as_str());
        prop_assert_eq!(mint.sandbox_id(), &sandbox);
        // ...and nothing of the class: the same id of another class gets the same mint.
        if class != CallerClass::Internal {
            let other_class = if class == CallerClass::User { CallerClass::Service } else { CallerClass::User };
            let (other_mint, _) =
                split_for(&self::caller(&identity, other_class), workflow, &org, &session, &exec, &sandbox);
            prop_assert_eq!(&other_mint, &mint);
        }

        // The environment is exactly the contract's, written out here from the inputs (the
        // class by its wire name)...
        let class_name = match class {
            CallerClass::User => "user",
            CallerClass::Service => "service",
            CallerClass::Internal => "internal",
        };
        let expected = vec![
            ("SANDLANE_CALLER_CLASS", class_name),
            ("SANDLANE_SANDBOX_ID", sandbox.as_str()),
            ("SANDLANE_ORG", org.as_str()),
            ("SANDLANE_SESSION_ID", if workflow { "" } else { session.as_str() }),
            ("SANDLANE_EXECUTION_ID", exec.as_str()),
            ("SANDLANE_TOKEN_FILE", "/run/sandlane/token"),
            ("HOME", "/workspace"),
            ("PATH", "/usr/local/bin:/usr/bin:/bin"),
            ("HTTP_PROXY", "http://127.0.0.1:3128"),
            ("HTTPS_PROXY", "http://127.0.0.1:3128"),
            ("http_proxy", "http://127.0.0.1:3128"),
            ("https_proxy", "http://127.0.0.1:3128"),
            ("NO_PROXY", "localhost,127.0.0.1,::1"),
            ("no_proxy", "localhost,127.0.0.1,::1"),
            ("NODE_USE_ENV_PROXY", "1"),
            ("SSL_CERT_FILE", "/run/sandlane/ca-bundle.pem"),
            ("REQUESTS_CA_BUNDLE", "/run/sandlane/ca-bundle.pem"),
            ("CURL_CA_BUNDLE", "/run/sandlane/ca-bundle.pem"),
            ("GIT_SSL_CAINFO", "/run/sandlane/ca-bundle.pem"),
            ("NODE_EXTRA_CA_CERTS", "/run/sandlane/ca.pem"),
        ];
        let vars = env.vars();
        let seen: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        prop_assert_eq!(seen, expected);
        prop_assert_eq!(env.caller_class(), class);
        // ...and nothing of the id: another identity of the same class gets the same
        // environment, serialized form included.
        if class != CallerClass::Internal {
            let (_, other_env) =
                split_for(&self::caller("someone-else", class), workflow, &org, &session, &exec, &sandbox);
            prop_assert_eq!(&other_env, &env);
            prop_assert_eq!(serde_json::to_string(&other_env).unwrap(), serde_json::to_string(&env).unwrap());
        }
    }
}
