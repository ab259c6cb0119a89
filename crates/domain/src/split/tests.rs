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

proptest! {
    #[test]
    fn mint_sees_the_id_and_not_the_class_env_sees_the_class_and_not_the_id(
        identity in id(), class in class(), org in id(), session in id(), exec in id(),
        workflow: bool, t in 0u64..(1 << 48), r: u128,
    ) {
        let caller = caller(&identity, class);
        let sandbox = SandboxId::generate(t, r);
        let (mint, env) = if workflow {
            let e = WorkflowExecution {
                org: OrgId::parse(org.clone()).unwrap(),
                execution_id: ExecutionId::parse(exec.clone()).unwrap(),
                phase: Phase::Pending,
            };
            split_caller(&e, &caller, &sandbox)
        } else {
            let e = AgentExecution {
                org: OrgId::parse(org.clone()).unwrap(),
                session_id: SessionId::parse(session.clone()).unwrap(),
                execution_id: ExecutionId::parse(exec.clone()).unwrap(),
                phase: Phase::Pending,
            };
            split_caller(&e, &caller, &sandbox)
        };

        // The mint holds the id and the sandbox facts; its Debug form shows every field
        // it has, and no class name appears there as a field value.
        prop_assert_eq!(mint.subject(), caller.identity_id());
        prop_assert_eq!(mint.session_claim(), if workflow { "" } else { session.as_str() });
        prop_assert_eq!(mint.execution_id().as_str(), exec.as_str());
        prop_assert_eq!(mint.sandbox_id(), &sandbox);
        let mint_dbg = format!("{mint:?}");
        let inputs_mention_class = [&identity, &org, &session, &exec]
            .iter()
            .any(|s| s.to_ascii_lowercase().contains("class"));
        if !inputs_mention_class {
            prop_assert!(!mint_dbg.to_ascii_lowercase().contains("class"), "{}", mint_dbg);
        }

        // The environment holds the class, and the identity id appears in no variable
        // unless it is also one of the sandbox facts (an org named like the caller).
        prop_assert_eq!(env.caller_class(), class);
        let vars = env.vars();
        let class_var = vars.iter().find(|(k, _)| *k == "SANDLANE_CALLER_CLASS").unwrap();
        prop_assert_eq!(class_var.1.as_str(), class.as_str());
        // The sandbox facts, and the fixed values (a one-letter id like "l" is in "/bin").
        let facts = [
            org.as_str(), session.as_str(), exec.as_str(), sandbox.as_str(), class.as_str(),
            TOKEN_FILE_PATH, WORKSPACE_PATH, SANDBOX_PATH,
        ];
        let id = caller.identity_id().as_str();
        if !facts.iter().any(|f| f.contains(id)) {
            for (name, value) in &vars {
                prop_assert!(!value.contains(id), "{} = {} leaks the caller id", name, value);
            }
            prop_assert!(!serde_json::to_string(&env).unwrap().contains(id));
        }
        let names: Vec<_> = vars.iter().map(|(k, _)| *k).collect();
        prop_assert_eq!(names, vec![
            "SANDLANE_CALLER_CLASS", "SANDLANE_SANDBOX_ID", "SANDLANE_ORG",
            "SANDLANE_SESSION_ID", "SANDLANE_EXECUTION_ID", "SANDLANE_TOKEN_FILE",
            "HOME", "PATH",
        ]);
    }
}
